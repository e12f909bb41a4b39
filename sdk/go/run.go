package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Run serves d over the process's stdin and stdout until shutdown, then exits
// the process: status 0 on a clean end (shutdown, stdin closed, SIGTERM or
// SIGINT), 1 when the protocol broke or Shutdown failed. It first takes stdout
// for the protocol alone: file descriptor 1 and os.Stdout then lead to stderr,
// so output of fmt.Println, a library or a child process lands in devshim's
// log. The SDK's own warnings go to stderr too, unless opts.Log says otherwise.
func Run(d Driver, opts Options) {
	if opts.Log == nil {
		opts.Log = os.Stderr
	}
	out, err := ownStdout()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ERROR: cannot take stdout for the protocol: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err = Serve(ctx, d, os.Stdin, out, opts)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(opts.Log, "ERROR: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

package driver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"unicode/utf8"
)

// Bounds on what the SDK reads and keeps, as devshim's own (docs/driver-protocol.md,
// "Transport and framing").
const (
	// MaxLineBytes is the largest message, newline excluded, either way.
	MaxLineBytes = 32 * 1024 * 1024
	// MaxInFlight is how many requests run at once; reading waits while that many do.
	MaxInFlight = 1024
	// MaxNUMANode is the largest NUMA node ID a device may name (Linux's MAX_NUMNODES - 1).
	MaxNUMANode = 1023
)

// Options name the driver to devshim (the initialize answer's DriverInfo) and
// say where the SDK logs.
type Options struct {
	// Name defaults to the driver's type name.
	Name string
	// Version defaults to "0.0.0".
	Version string
	// Log receives the SDK's own warnings, one line each; nil means discard.
	// Run sets it to stderr, which devshim copies into its log.
	Log io.Writer
}

// semver is semver.org 2.0.0's rule, in ASCII digits.
var semver = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)` +
	`(?:-((?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

type handler func(ctx context.Context, params json.RawMessage) (any, error)

// server is one connection to devshim: no state outside it.
type server struct {
	driver  Driver
	opts    Options
	out     *lineWriter
	notify  *Notifier
	methods map[string]handler

	finishOnce sync.Once
	finishErr  error
	shutdown   chan struct{} // closed once shutdown is answered
	closeOnce  sync.Once
}

// Serve answers devshim's requests read from in, writing answers and
// notifications to out, until devshim says shutdown, in ends, or ctx is
// cancelled; every request read before then is answered first, and the
// driver's Shutdown runs once. It returns nil on a clean end, ctx's error when
// cancelled, or what broke the framing (a line over MaxLineBytes, a failed read
// or write). A goroutine reading in stays blocked in Read if Serve returns
// before in ends (shutdown or ctx): Run's process exits then.
func Serve(ctx context.Context, d Driver, in io.Reader, out io.Writer, opts Options) error {
	if opts.Name == "" {
		opts.Name = typeName(d)
	}
	if opts.Version == "" {
		opts.Version = "0.0.0"
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &server{driver: d, opts: opts, out: &lineWriter{w: out}, shutdown: make(chan struct{})}
	// The Notifier's context ends before the driver's Shutdown runs, so a Shutdown that waits
	// for background work started in Initialize does not wait forever.
	notifyCtx, endNotify := context.WithCancel(ctx)
	defer endNotify()
	s.notify = &Notifier{out: s.out, driver: d, ctx: notifyCtx, end: endNotify}
	s.methods = s.table()

	lines := make(chan []byte)
	readErr := make(chan error, 1)
	go readLines(in, lines, readErr)

	var inFlight sync.WaitGroup
	slots := make(chan struct{}, MaxInFlight)
	var err error
loop:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				err = <-readErr
				break loop
			}
			select { // wait for a slot, so a flood of requests is read no faster than answered
			case slots <- struct{}{}:
			case <-ctx.Done():
				err = ctx.Err()
				break loop
			}
			inFlight.Add(1)
			go func() {
				defer func() { <-slots; inFlight.Done() }()
				s.receive(ctx, line)
			}()
		case <-s.shutdown:
			break loop
		case <-ctx.Done():
			err = ctx.Err()
			break loop
		}
	}
	// Every request read so far is answered before we go (shutdown's own included).
	inFlight.Wait()
	s.notify.close()
	if finishErr := s.finish(context.WithoutCancel(ctx)); err == nil && finishErr != nil {
		err = finishErr
	}
	if werr := s.out.failed(); err == nil && werr != nil {
		err = werr
	}
	return err
}

// readLines sends each line of in, without its newline, until in ends (nil) or breaks.
func readLines(in io.Reader, lines chan<- []byte, done chan<- error) {
	defer close(lines)
	reader := bufio.NewReaderSize(in, 64*1024)
	for {
		var line []byte
		for {
			chunk, err := reader.ReadSlice('\n')
			if len(line)+len(chunk) > MaxLineBytes+1 {
				done <- fmt.Errorf("a message is longer than the %d-byte limit", MaxLineBytes)
				return
			}
			line = append(line, chunk...)
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF {
				if len(bytes.TrimSpace(line)) > 0 {
					lines <- line // a last line without its newline is still a message
				}
				done <- nil
				return
			}
			if err != nil {
				done <- err
				return
			}
			break
		}
		line = line[:len(line)-1]
		if len(bytes.TrimSpace(line)) > 0 {
			lines <- line
		}
	}
}

// envelope is a JSON-RPC message as read: members kept raw, to tell absent from null.
type envelope map[string]json.RawMessage

func (s *server) receive(ctx context.Context, line []byte) {
	if !utf8.Valid(line) {
		s.reply(nil, nil, &Error{CodeParseError, "not JSON: the line is not UTF-8"})
		return
	}
	var message envelope
	if err := json.Unmarshal(line, &message); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) || !json.Valid(line) {
			s.reply(nil, nil, &Error{CodeParseError, "not JSON: " + err.Error()})
		} else {
			s.reply(nil, nil, &Error{CodeInvalidRequest, "not a JSON-RPC 2.0 object"})
		}
		return
	}
	if string(bytes.TrimSpace(message["jsonrpc"])) != `"2.0"` {
		s.reply(nil, nil, &Error{CodeInvalidRequest, "not a JSON-RPC 2.0 object"})
		return
	}
	id, isRequest := message["id"]
	rawMethod, hasMethod := message["method"]
	if !hasMethod {
		_, result := message["result"]
		_, failure := message["error"]
		if isRequest && (result || failure) {
			return // a response: this side sends no requests, so there is nothing to match it to
		}
		s.reply(id, nil, &Error{CodeInvalidRequest, "neither a request nor a response"})
		return
	}
	var method string
	if len(rawMethod) == 0 || rawMethod[0] != '"' || json.Unmarshal(rawMethod, &method) != nil {
		s.reply(id, nil, &Error{CodeInvalidRequest, "method must be a string"})
		return
	}
	if !isRequest {
		return // a notification: devshim sends none a driver must act on
	}
	call, known := s.methods[method]
	if !known {
		s.reply(id, nil, Errorf(CodeMethodNotFound, "unknown method '%s'", method))
		return
	}
	result, err := s.call(ctx, call, message["params"])
	s.reply(id, result, err)
}

// call runs one handler; a panic in driver code answers that request, not the whole driver.
func (s *server) call(ctx context.Context, call handler, params json.RawMessage) (result any, err error) {
	defer func() {
		if recovered := recover(); recovered != nil {
			s.logf("ERROR: a request panicked: %v", recovered)
			result, err = nil, fmt.Errorf("panic: %v", recovered)
		}
	}()
	if params == nil || isNull(params) {
		params = json.RawMessage("{}") // JSON-RPC lets a request leave params out
	}
	return call(ctx, params)
}

func (s *server) reply(id json.RawMessage, result any, err error) {
	if id == nil {
		id = json.RawMessage("null")
	}
	answer := map[string]any{"jsonrpc": "2.0", "id": id}
	if err != nil {
		answer["error"] = asError(err)
	} else {
		answer["result"] = result
	}
	if werr := s.out.send(answer); werr != nil && err == nil {
		var tooLong *lineTooLong
		if errors.As(werr, &tooLong) || errors.As(werr, new(*json.UnsupportedValueError)) {
			s.logf("ERROR: %v", werr)
			answer["error"], answer["result"] = &Error{CodeInternalError, werr.Error()}, nil
			delete(answer, "result")
			_ = s.out.send(answer)
		}
	}
}

func (s *server) logf(format string, args ...any) {
	fmt.Fprintf(s.opts.Log, strings.TrimRight(format, "\n")+"\n", args...)
}

// finish runs the driver's Shutdown once, whether devshim said shutdown or just went away.
func (s *server) finish(ctx context.Context) error {
	s.finishOnce.Do(func() {
		s.notify.end()
		if down, ok := s.driver.(Shutdowner); ok {
			s.finishErr = down.Shutdown(ctx)
		}
	})
	return s.finishErr
}

func typeName(d Driver) string {
	name := fmt.Sprintf("%T", d)
	name = strings.TrimLeft(name, "*")
	if dot := strings.LastIndexByte(name, '.'); dot >= 0 {
		name = name[dot+1:]
	}
	return name
}

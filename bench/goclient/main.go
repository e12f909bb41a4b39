// goclient: times unary v1beta1 Allocate from Go, as the kubelet calls it, against one or more
// device-plugin sockets (bench/goview.py, row `goclient`).
//
//	goclient [-calls N] [-rounds R] [-warmup W] [-device ID] NAME=SOCKET[=DEVICE] ...
//
// Each target gets W warm-up calls, then N calls in R rounds; in every round each target takes
// its N/R calls in turn, so machine noise hits all targets alike. Every call asks one device for
// one container, through the upstream generated client (k8s.io/kubelet's v1beta1), the way the
// kubelet's endpoint does. Prints one JSON object on stdout: {NAME: [seconds per call, ...]}.
// A failed call ends the run with exit status 1 and a line naming the target.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type target struct {
	name   string
	socket string
	device string
	conn   *grpc.ClientConn
	client pb.DevicePluginClient
}

func parseTarget(arg, device string) (target, error) {
	parts := strings.SplitN(arg, "=", 3)
	if len(parts) < 2 || parts[0] == "" || parts[1] == "" {
		return target{}, fmt.Errorf("target %q: want NAME=SOCKET or NAME=SOCKET=DEVICE", arg)
	}
	t := target{name: parts[0], socket: parts[1], device: device}
	if len(parts) == 3 {
		t.device = parts[2]
	}
	if t.device == "" {
		return target{}, fmt.Errorf("target %q: no device ID (-device, or NAME=SOCKET=DEVICE)", arg)
	}
	return t, nil
}

// allocate makes one call and returns its latency; a reply without exactly one container's
// answer is an error too, so a broken target cannot pass for a fast one.
func (t *target) allocate(timeout time.Duration) (time.Duration, error) {
	req := &pb.AllocateRequest{ContainerRequests: []*pb.ContainerAllocateRequest{{DevicesIds: []string{t.device}}}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	resp, err := t.client.Allocate(ctx, req)
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	if n := len(resp.ContainerResponses); n != 1 {
		return 0, fmt.Errorf("%d container responses for 1 container", n)
	}
	return took, nil
}

func run(targets []target, calls, rounds, warmup int, timeout time.Duration) (map[string][]float64, error) {
	for i := range targets {
		t := &targets[i]
		// The kubelet dials a plugin's socket the same way: a unix target, no TLS.
		conn, err := grpc.NewClient("unix://"+t.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, fmt.Errorf("target %s (%s): %w", t.name, t.socket, err)
		}
		t.conn, t.client = conn, pb.NewDevicePluginClient(conn)
		defer conn.Close()
	}
	call := func(t *target) (time.Duration, error) {
		took, err := t.allocate(timeout)
		if err != nil {
			return 0, fmt.Errorf("target %s (%s): Allocate of %s: %w", t.name, t.socket, t.device, err)
		}
		return took, nil
	}
	for i := range targets {
		for range warmup {
			if _, err := call(&targets[i]); err != nil {
				return nil, err
			}
		}
	}
	perRound := max(1, calls/rounds)
	out := make(map[string][]float64, len(targets))
	for range rounds {
		for i := range targets {
			t := &targets[i]
			for range perRound {
				took, err := call(t)
				if err != nil {
					return nil, err
				}
				out[t.name] = append(out[t.name], took.Seconds())
			}
		}
	}
	return out, nil
}

func main() {
	calls := flag.Int("calls", 1000, "timed calls per target")
	rounds := flag.Int("rounds", 10, "rounds the timed calls are split into, targets alternating")
	warmup := flag.Int("warmup", 100, "untimed calls per target first")
	device := flag.String("device", "", "device ID to allocate, for targets that name none")
	timeout := flag.Duration("timeout", 10*time.Second, "deadline of each call")
	flag.Parse()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "goclient:", err)
		os.Exit(1)
	}
	if flag.NArg() == 0 {
		fail(errors.New("no targets: give NAME=SOCKET[=DEVICE] arguments"))
	}
	if *calls < 1 || *rounds < 1 || *warmup < 0 {
		fail(errors.New("-calls and -rounds must be at least 1, -warmup at least 0"))
	}
	targets := make([]target, 0, flag.NArg())
	seen := map[string]bool{}
	for _, arg := range flag.Args() {
		t, err := parseTarget(arg, *device)
		if err != nil {
			fail(err)
		}
		if seen[t.name] {
			fail(fmt.Errorf("target %s given twice", t.name))
		}
		seen[t.name] = true
		targets = append(targets, t)
	}
	out, err := run(targets, *calls, *rounds, *warmup, *timeout)
	if err != nil {
		fail(err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}

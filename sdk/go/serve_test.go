package driver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// slow is a driver whose PreferredAllocation waits until released.
type slow struct{ release chan struct{} }

func (s *slow) Resources() []Resource {
	return []Resource{{Name: "example.com/x", PreferredAllocation: true}}
}

func (s *slow) ListDevices(ctx context.Context, _ string) ([]Device, error) {
	fmt.Println("a stray print") // must never reach the protocol's stdout
	// Nor a write to file descriptor 1 itself, as a C library or a child process makes.
	_, _ = os.NewFile(1, "fd1").WriteString("a stray write to fd 1\n")
	return []Device{{ID: "x0", Health: Healthy}}, nil
}

func (s *slow) Allocate(ctx context.Context, _ string, containers [][]string) ([]Grant, error) {
	return make([]Grant, len(containers)), nil
}

func (s *slow) PreferredAllocation(ctx context.Context, _ string, req PreferenceRequest) ([]string, error) {
	select {
	case <-s.release:
		return req.Available, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type session struct {
	t      *testing.T
	in     *io.PipeWriter
	out    *bufio.Scanner
	served chan error
}

func start(t *testing.T, ctx context.Context, d Driver) *session {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &session{t: t, in: inW, out: bufio.NewScanner(outR), served: make(chan error, 1)}
	go func() { s.served <- Serve(ctx, d, inR, outW, Options{}); outW.Close() }()
	return s
}

func (s *session) send(line string) {
	if _, err := io.WriteString(s.in, line+"\n"); err != nil {
		s.t.Fatal(err)
	}
}

func (s *session) next() map[string]any {
	if !s.out.Scan() {
		s.t.Fatalf("no more output: %v", s.out.Err())
	}
	var m map[string]any
	if err := json.Unmarshal(s.out.Bytes(), &m); err != nil {
		s.t.Fatalf("not JSON: %q", s.out.Text())
	}
	return m
}

func TestASlowRequestDoesNotHoldUpTheNext(t *testing.T) {
	d := &slow{release: make(chan struct{})}
	s := start(t, context.Background(), d)
	s.send(`{"jsonrpc":"2.0","id":1,"method":"preferred_allocation","params":{"resource":"example.com/x","containers":[{"available":["x0"],"size":1}]}}`)
	s.send(`{"jsonrpc":"2.0","id":2,"method":"allocate","params":{"resource":"example.com/x","containers":[{"device_ids":["x0"]}]}}`)
	if first := s.next(); first["id"] != 2.0 {
		t.Fatalf("allocate should answer first, got %v", first)
	}
	close(d.release)
	if second := s.next(); second["id"] != 1.0 {
		t.Fatalf("then the preference, got %v", second)
	}
	s.send(`{"jsonrpc":"2.0","id":3,"method":"shutdown"}`)
	if m := s.next(); m["id"] != 3.0 {
		t.Fatalf("shutdown: %v", m)
	}
	if err := <-s.served; err != nil {
		t.Fatal(err)
	}
}

func TestCancellingTheContextEndsServingAndTheRequestsInFlight(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := start(t, ctx, &slow{release: make(chan struct{})})
	s.send(`{"jsonrpc":"2.0","id":1,"method":"preferred_allocation","params":{"resource":"example.com/x","containers":[{"available":["x0"],"size":1}]}}`)
	time.AfterFunc(50*time.Millisecond, cancel)
	if m := s.next(); m["error"] == nil {
		t.Fatalf("the cancelled request should answer an error, got %v", m)
	}
	select {
	case err := <-s.served:
		if err != context.Canceled {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestALineOverTheLimitEndsServing(t *testing.T) {
	err := Serve(context.Background(), &slow{}, strings.NewReader(strings.Repeat("x", MaxLineBytes+2)), io.Discard, Options{})
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("got %v", err)
	}
}

func TestCapabilityMismatchesAreNamed(t *testing.T) {
	problems := capabilityMismatches(&slow{}, "slow", []Resource{{Name: "a", Prestart: true}})
	joined := strings.Join(problems, "\n")
	for _, want := range []string{"a declares prestart but slow does not implement PreStarter",
		"slow implements PreferredAllocator but no resource in Resources() sets preferred_allocation"} {
		if !strings.Contains(joined, want) {
			t.Errorf("missing %q in %q", want, joined)
		}
	}
}

// The child process of TestAStrayPrintNeverReachesTheProtocol: Run over the real stdio.
func TestMain(m *testing.M) {
	if os.Getenv("DEVSHIM_SDK_TEST_CHILD") == "1" {
		Run(&slow{release: make(chan struct{})}, Options{Name: "child"})
	}
	os.Exit(m.Run())
}

func TestAStrayPrintNeverReachesTheProtocol(t *testing.T) {
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "DEVSHIM_SDK_TEST_CHILD=1")
	child.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"list_devices","params":{"resource":"example.com/x"}}` + "\n")
	var stderr strings.Builder
	child.Stderr = &stderr
	out, err := child.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, `{"id":1`) || strings.Contains(got, "stray") {
		t.Fatalf("stdout: %q", got)
	}
	if !strings.Contains(stderr.String(), "a stray print") || !strings.Contains(stderr.String(), "fd 1") {
		t.Fatalf("the print should be on stderr: %q", stderr.String())
	}
}

// waiter starts background work in Initialize and waits for it in Shutdown, as drivers do.
type waiter struct {
	slow
	done chan struct{}
}

func (w *waiter) Initialize(ctx context.Context, _ *InitializeParams, n *Notifier) error {
	go func() { <-n.Context().Done(); close(w.done) }()
	return nil
}

func (w *waiter) Shutdown(ctx context.Context) error { <-w.done; return nil }

func TestShutdownCanWaitForBackgroundWorkStartedInInitialize(t *testing.T) {
	s := start(t, context.Background(), &waiter{done: make(chan struct{})})
	s.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocol_version":"1.2.0"}}`)
	s.next()
	s.send(`{"jsonrpc":"2.0","id":2,"method":"shutdown"}`)
	if m := s.next(); m["id"] != 2.0 || m["result"] == nil {
		t.Fatalf("shutdown: %v", m)
	}
	select {
	case err := <-s.served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return: Shutdown waited on a context that never ended")
	}
}

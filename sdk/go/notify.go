package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
)

// Notifier sends a driver's notifications to devshim. The SDK makes one per
// connection and hands it to Initializer.Initialize; devshim takes
// notifications from initialize on (one sent before devshim's initialize
// arrives waits for it). Every method returns ErrClosed once the connection
// has ended, and is safe to call from any goroutine.
type Notifier struct {
	out    *lineWriter
	driver Driver
	ctx    context.Context
	end    context.CancelFunc

	mu     sync.Mutex
	opened chan struct{}
	closed bool
}

// Context is cancelled when serving ends, before the driver's Shutdown runs:
// background work started in Initialize selects on its Done.
func (n *Notifier) Context() context.Context { return n.ctx }

// DevicesChanged sends the full new device list of resource (devices plugged
// in or pulled out). A device left out is removed from the node.
func (n *Notifier) DevicesChanged(ctx context.Context, resource string, devices []Device) error {
	if err := checkDevices(devices); err != nil {
		return err
	}
	return n.send(ctx, NotifyDevicesChanged, &DevicesChangedParams{Resource: resource, Devices: devices})
}

// HealthChanged sends only the devices whose health changed: cheaper than a
// full list for large inventories.
func (n *Notifier) HealthChanged(ctx context.Context, resource string, changes []HealthChange) error {
	return n.send(ctx, NotifyHealthChanged, &HealthChangedParams{Resource: resource, Changes: changes})
}

// ResourcesChanged sends the driver's current Resources(); devshim lists a new
// resource's devices, then serves it.
func (n *Notifier) ResourcesChanged(ctx context.Context) error {
	return n.send(ctx, NotifyResourcesChanged, &ResourcesChangedParams{Resources: n.driver.Resources()})
}

// Log sends a line for devshim's log under the driver's name, for when stderr
// is not convenient (stderr lines reach the same log).
func (n *Notifier) Log(ctx context.Context, level LogLevel, message string) error {
	return n.send(ctx, NotifyLog, &LogParams{Level: level, Message: message})
}

func (n *Notifier) lazyInit() chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.opened == nil {
		n.opened = make(chan struct{})
	}
	return n.opened
}

func (n *Notifier) open() {
	opened := n.lazyInit()
	n.mu.Lock()
	defer n.mu.Unlock()
	select {
	case <-opened:
	default:
		close(opened)
	}
}

func (n *Notifier) close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
}

func (n *Notifier) send(ctx context.Context, method string, params any) error {
	// One sent before devshim's initialize waits for it.
	if n.isClosed() {
		return ErrClosed
	}
	select {
	case <-n.lazyInit():
	case <-ctx.Done():
		return ctx.Err()
	case <-n.ctx.Done():
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if n.isClosed() {
		return ErrClosed
	}
	return n.out.send(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
}

func (n *Notifier) isClosed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closed
}

// lineWriter writes one message per line, whole, one writer at a time.
type lineWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

type lineTooLong struct{ size int }

func (e *lineTooLong) Error() string {
	return fmt.Sprintf("a %d-byte message is over the %d-byte line limit", e.size, MaxLineBytes)
}

func (l *lineWriter) send(message any) error {
	data, err := json.Marshal(message)
	if err != nil {
		return err
	}
	if len(data) > MaxLineBytes {
		return &lineTooLong{len(data)}
	}
	data = append(data, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return ErrClosed
	}
	if _, err := l.w.Write(data); err != nil {
		l.err = err
		return ErrClosed
	}
	return nil
}

func (l *lineWriter) failed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// goplug: a small, vendor-style Kubernetes device plugin (device plugin API
// v1beta1) used to exercise devshim's legacy adapter.
//
// It is written the way vendor plugins are usually written and shares no code
// with devshim: a Go module importing the upstream API package
// k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 (pinned in go.sum), its own
// gRPC server on <dir>/<socket>, its own Register call to <dir>/kubelet.sock,
// its own ListAndWatch loop that resends the full device list on every change,
// and a poll loop that re-creates the socket and registers again when the
// socket disappears (kubelet restart).
//
// Test hooks:
//
//	SIGUSR1  toggle the last device Healthy <-> Unhealthy, push a new list
//	SIGUSR2  exit(3) immediately, leaving the socket behind (simulated crash)
//	SIGTERM  stop serving, remove the socket, exit 0 (SIGINT does the same)
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	kubeletSocket  = "kubelet.sock"
	pollInterval   = 1 * time.Second
	lateServeDelay = 1 * time.Second
	dialTimeout    = 5 * time.Second
	// The kubelet may dial us back inside Register (the fake one does, with a
	// 10 s timeout), so give the Register RPC comfortably longer than that.
	registerTimeout = 20 * time.Second
)

type config struct {
	dir                 string
	resource            string
	deviceIDs           []string
	socket              string
	registerBeforeServe bool
	preStart            bool
	preferred           bool
}

type plugin struct {
	pb.UnimplementedDevicePluginServer

	cfg        config
	socketPath string

	mu         sync.Mutex
	devices    []*pb.Device
	known      map[string]bool
	subs       map[chan struct{}]struct{}
	server     *grpc.Server
	serving    bool        // listener exists on socketPath
	serveTimer *time.Timer // pending late serve (-register-before-serve)
	stopping   bool

	registered     bool
	kubeletSockIno uint64 // inode of kubelet.sock at the last successful Register
}

func newPlugin(cfg config) *plugin {
	p := &plugin{
		cfg:        cfg,
		socketPath: filepath.Join(cfg.dir, cfg.socket),
		known:      map[string]bool{},
		subs:       map[chan struct{}]struct{}{},
	}
	for i, id := range cfg.deviceIDs {
		p.devices = append(p.devices, &pb.Device{
			ID:       id,
			Health:   pb.Healthy,
			Topology: &pb.TopologyInfo{Nodes: []*pb.NUMANode{{ID: int64(i % 2)}}},
		})
		p.known[id] = true
	}
	return p
}

func (p *plugin) options() *pb.DevicePluginOptions {
	return &pb.DevicePluginOptions{
		PreStartRequired:                p.cfg.preStart,
		GetPreferredAllocationAvailable: p.cfg.preferred,
	}
}

// snapshot returns a deep copy of the device list (caller must hold p.mu).
func (p *plugin) snapshotLocked() []*pb.Device {
	out := make([]*pb.Device, 0, len(p.devices))
	for _, d := range p.devices {
		nodes := make([]*pb.NUMANode, 0, len(d.Topology.GetNodes()))
		for _, n := range d.Topology.GetNodes() {
			nodes = append(nodes, &pb.NUMANode{ID: n.ID})
		}
		out = append(out, &pb.Device{ID: d.ID, Health: d.Health, Topology: &pb.TopologyInfo{Nodes: nodes}})
	}
	return out
}

func (p *plugin) notifyLocked() {
	for ch := range p.subs {
		select {
		case ch <- struct{}{}:
		default: // an update is already pending; the stream will send the latest list
		}
	}
}

// toggleLast flips the health of the last device and notifies every stream.
func (p *plugin) toggleLast() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.devices) == 0 {
		log.Printf("SIGUSR1: no devices to toggle")
		return
	}
	d := p.devices[len(p.devices)-1]
	if d.Health == pb.Healthy {
		d.Health = pb.Unhealthy
	} else {
		d.Health = pb.Healthy
	}
	log.Printf("SIGUSR1: device %s is now %s; pushing new list to %d stream(s)", d.ID, d.Health, len(p.subs))
	p.notifyLocked()
}

// ---- DevicePlugin service -------------------------------------------------

func (p *plugin) GetDevicePluginOptions(ctx context.Context, _ *pb.Empty) (*pb.DevicePluginOptions, error) {
	log.Printf("GetDevicePluginOptions")
	return p.options(), nil
}

func (p *plugin) ListAndWatch(_ *pb.Empty, stream pb.DevicePlugin_ListAndWatchServer) error {
	ch := make(chan struct{}, 1)
	p.mu.Lock()
	p.subs[ch] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.subs, ch)
		p.mu.Unlock()
	}()
	log.Printf("ListAndWatch: stream opened")
	ch <- struct{}{} // send the initial list straight away
	for {
		select {
		case <-stream.Context().Done():
			log.Printf("ListAndWatch: stream closed: %v", stream.Context().Err())
			return nil
		case <-ch:
			p.mu.Lock()
			devs := p.snapshotLocked()
			p.mu.Unlock()
			if err := stream.Send(&pb.ListAndWatchResponse{Devices: devs}); err != nil {
				log.Printf("ListAndWatch: send failed: %v", err)
				return err
			}
			log.Printf("ListAndWatch: sent %s", describe(devs))
		}
	}
}

func (p *plugin) GetPreferredAllocation(ctx context.Context, req *pb.PreferredAllocationRequest) (*pb.PreferredAllocationResponse, error) {
	resp := &pb.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		var ids []string
		seen := map[string]bool{}
		for _, id := range cr.MustIncludeDeviceIDs {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
		for _, id := range cr.AvailableDeviceIDs {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
		size := int(cr.AllocationSize)
		if size < 0 {
			size = 0
		}
		if len(ids) > size {
			ids = ids[:size]
		}
		log.Printf("GetPreferredAllocation: available=%v must_include=%v size=%d -> %v",
			cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, cr.AllocationSize, ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pb.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

func (p *plugin) Allocate(ctx context.Context, req *pb.AllocateRequest) (*pb.AllocateResponse, error) {
	resp := &pb.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		for _, id := range cr.DevicesIds {
			if !p.known[id] {
				log.Printf("Allocate: unknown device %s", id)
				return nil, status.Errorf(codes.InvalidArgument, "unknown device %s", id)
			}
		}
		car := &pb.ContainerAllocateResponse{
			Envs: map[string]string{"GOPLUG_DEVICES": strings.Join(cr.DevicesIds, ",")},
		}
		for _, id := range cr.DevicesIds {
			car.Devices = append(car.Devices, &pb.DeviceSpec{
				ContainerPath: "/dev/goplug/" + id,
				HostPath:      "/dev/null",
				Permissions:   "rw",
			})
			car.CdiDevices = append(car.CdiDevices, &pb.CDIDevice{Name: "example.com/goplug=" + id})
		}
		log.Printf("Allocate: %v", cr.DevicesIds)
		resp.ContainerResponses = append(resp.ContainerResponses, car)
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(ctx context.Context, req *pb.PreStartContainerRequest) (*pb.PreStartContainerResponse, error) {
	log.Printf("PreStartContainer: %v", req.DevicesIds)
	return &pb.PreStartContainerResponse{}, nil
}

// ---- server lifecycle -------------------------------------------------------

// serve creates the socket and starts the gRPC server.
func (p *plugin) serve() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.serveTimer = nil
	if p.stopping || p.serving {
		return nil
	}
	if err := os.Remove(p.socketPath); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	lis, err := net.Listen("unix", p.socketPath)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", p.socketPath, err)
	}
	srv := grpc.NewServer()
	pb.RegisterDevicePluginServer(srv, p)
	p.server = srv
	p.serving = true
	go func() {
		if err := srv.Serve(lis); err != nil {
			log.Printf("gRPC server on %s exited: %v", p.socketPath, err)
		}
	}()
	log.Printf("serving on %s", p.socketPath)
	return nil
}

// stopServing stops the gRPC server (closing all streams) without touching
// whatever file is at the socket path now.
func (p *plugin) stopServingLocked() {
	if p.serveTimer != nil {
		p.serveTimer.Stop()
		p.serveTimer = nil
	}
	if p.server != nil {
		p.server.Stop()
		p.server = nil
	}
	p.serving = false
}

func dialUnix(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", addr)
}

func (p *plugin) register() error {
	kpath := filepath.Join(p.cfg.dir, kubeletSocket)
	dctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	conn, err := grpc.DialContext(dctx, kpath, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithContextDialer(dialUnix))
	if err != nil {
		return fmt.Errorf("dial %s: %w", kpath, err)
	}
	defer conn.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), registerTimeout)
	defer rcancel()
	req := &pb.RegisterRequest{
		Version:      pb.Version,
		Endpoint:     p.cfg.socket,
		ResourceName: p.cfg.resource,
		Options:      p.options(),
	}
	if _, err := pb.NewRegistrationClient(conn).Register(rctx, req); err != nil {
		return fmt.Errorf("Register: %w", err)
	}
	return nil
}

// start brings the plugin up and registers it; it is also used for restarts.
func (p *plugin) start() {
	if p.cfg.registerBeforeServe {
		// Vendor bug on purpose: tell the kubelet about the socket before it exists.
		p.mu.Lock()
		p.serveTimer = time.AfterFunc(lateServeDelay, func() {
			if err := p.serve(); err != nil {
				log.Printf("late serve failed: %v", err)
			}
		})
		p.mu.Unlock()
		log.Printf("registering BEFORE serving (-register-before-serve); will serve in %v", lateServeDelay)
	} else if err := p.serve(); err != nil {
		log.Fatalf("cannot serve: %v", err)
	}
	p.tryRegister()
}

func (p *plugin) tryRegister() {
	log.Printf("registering %s (endpoint %s, version %s, options %+v) with %s",
		p.cfg.resource, p.cfg.socket, pb.Version, p.options(), filepath.Join(p.cfg.dir, kubeletSocket))
	if err := p.register(); err != nil {
		log.Printf("registration failed (will retry in %v): %v", pollInterval, err)
		p.registered = false
		return
	}
	p.registered = true
	p.kubeletSockIno = inode(filepath.Join(p.cfg.dir, kubeletSocket))
	log.Printf("registered with kubelet")
}

func (p *plugin) restart(why string) {
	log.Printf("restarting: %s", why)
	p.mu.Lock()
	p.stopServingLocked()
	p.mu.Unlock()
	p.start()
}

func inode(path string) uint64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// watch polls the plugin dir (vendors use fsnotify; a 1 s poll is enough here).
func (p *plugin) watch() {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for range t.C {
		p.mu.Lock()
		serving, pending, stopping := p.serving, p.serveTimer != nil, p.stopping
		p.mu.Unlock()
		if stopping {
			return
		}
		if serving {
			if _, err := os.Stat(p.socketPath); os.IsNotExist(err) {
				p.restart(fmt.Sprintf("socket %s was deleted", p.socketPath))
				continue
			}
		} else if !pending {
			p.restart("not serving")
			continue
		}
		if !p.registered {
			p.tryRegister()
			continue
		}
		if ino := inode(filepath.Join(p.cfg.dir, kubeletSocket)); ino != 0 && ino != p.kubeletSockIno {
			p.restart("kubelet.sock was re-created")
		}
	}
}

func (p *plugin) handleSignals() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT)
	for s := range sigs {
		switch s {
		case syscall.SIGUSR1:
			p.toggleLast()
		case syscall.SIGUSR2:
			log.Printf("SIGUSR2: simulating a crash, exit(3)")
			os.Exit(3)
		case syscall.SIGTERM, syscall.SIGINT:
			log.Printf("%v: stopping", s)
			p.mu.Lock()
			p.stopping = true
			p.stopServingLocked()
			p.mu.Unlock()
			if err := os.Remove(p.socketPath); err != nil && !os.IsNotExist(err) {
				log.Printf("remove %s: %v", p.socketPath, err)
			}
			log.Printf("stopped, socket removed")
			os.Exit(0)
		}
	}
}

func describe(devs []*pb.Device) string {
	parts := make([]string, 0, len(devs))
	for _, d := range devs {
		parts = append(parts, fmt.Sprintf("%s:%s", d.ID, d.Health))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func main() {
	log.SetOutput(os.Stderr)
	log.SetFlags(log.Ldate | log.Ltime | log.Lmicroseconds)
	log.SetPrefix(fmt.Sprintf("goplug[%d] ", os.Getpid()))

	var cfg config
	var devices string
	flag.StringVar(&cfg.dir, "dir", "/var/lib/kubelet/device-plugins", "device plugin directory (DP_DIR overrides)")
	flag.StringVar(&cfg.resource, "resource", "example.com/goplug", "extended resource name")
	flag.StringVar(&devices, "devices", "g0,g1,g2", "comma-separated device IDs")
	flag.StringVar(&cfg.socket, "socket", "goplug.sock", "socket file name inside -dir")
	flag.BoolVar(&cfg.registerBeforeServe, "register-before-serve", false, "call Register before serving (vendor bug), serve ~1s later")
	flag.BoolVar(&cfg.preStart, "prestart", false, "set options.pre_start_required")
	flag.BoolVar(&cfg.preferred, "preferred", false, "set options.get_preferred_allocation_available")
	flag.Parse()
	if env := os.Getenv("DP_DIR"); env != "" {
		cfg.dir = env
	}
	for _, id := range strings.Split(devices, ",") {
		if id = strings.TrimSpace(id); id != "" {
			cfg.deviceIDs = append(cfg.deviceIDs, id)
		}
	}

	p := newPlugin(cfg)
	log.Printf("starting: dir=%s resource=%s devices=%v socket=%s register-before-serve=%v prestart=%v preferred=%v",
		cfg.dir, cfg.resource, cfg.deviceIDs, cfg.socket, cfg.registerBeforeServe, cfg.preStart, cfg.preferred)
	go p.handleSignals()
	p.start()
	p.watch()
	select {}
}

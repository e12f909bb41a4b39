// N nodes' ResourceSlice publishers as the Go DRA drivers run them: one controller of
// k8s.io/dynamic-resource-allocation/resourceslice (the one the kubeletplugin helper starts) per
// simulated node, each with its own client and connection, its own node name and its own list
// and watch, publishing one pool of -devices devices. The bench's fleet row runs it beside
// devshim's own publishers (bench/fleet.py) against the same API server. It runs until SIGTERM
// and writes one line per publish error to stderr.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the API server's kubeconfig")
	nodes := flag.Int("nodes", 100, "simulated nodes")
	devices := flag.Int("devices", 8, "devices per node")
	driver := flag.String("driver", "fleet.example.com", "the DRA driver's name")
	prefix := flag.String("prefix", "go-fleet-", "node names: the prefix and a 4-digit index")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Started at once, as a fleet's nodes start: StartController waits for its informer's
	// first sync (polling once a second), so one after another would take N seconds.
	controllers := make([]*resourceslice.Controller, *nodes)
	var started sync.WaitGroup
	for i := range *nodes {
		started.Add(1)
		go func() {
			defer started.Done()
			controllers[i] = start(ctx, *kubeconfig, *driver, fmt.Sprintf("%s%04d", *prefix, i), i, *devices)
		}()
	}
	started.Wait()
	fmt.Printf("started %d\n", len(controllers))
	<-ctx.Done()
	for _, controller := range controllers {
		controller.Stop()
	}
}

// start is one node's publisher, with a client and a connection of its own.
func start(ctx context.Context, kubeconfig, driver, node string, index, devices int) *resourceslice.Controller {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fail(err)
	}
	// A dialer of its own keeps client-go from sharing one cached transport, and so one
	// connection, among the nodes: each real node has its own.
	config.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail(err)
	}
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: pooled(devices)}}}
	uid := types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", index))
	controller, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: driver,
		KubeClient: client,
		// A Node owner sets each slice's nodeName; its UID given, no Node is read.
		Owner:     &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node, UID: uid},
		Resources: &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: pool}},
		ErrorHandler: func(_ context.Context, err error, msg string) {
			fmt.Fprintf(os.Stderr, "%s: %s: %v\n", node, msg, err)
		},
	})
	if err != nil {
		fail(err)
	}
	return controller
}

func pooled(count int) []resourceapi.Device {
	devices := make([]resourceapi.Device, count)
	for i := range devices {
		devices[i] = resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i)}
	}
	return devices
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// Command go-fpga is a devshim driver, written with the Go SDK, for a made-up
// FPGA card: four devices on two NUMA nodes. Each container gets its cards as
// a device node, an env naming them and a CDI device whose spec the driver
// ships; DRA publishes each card's model, firmware and memory.
//
// Health comes from reports the card's management firmware drops into a
// folder (FPGA_REPORT_DIR): a file named after a card that reads "fault" turns
// it Unhealthy, one that reads "ok" Healthy again; the driver takes each report
// (removes the file) and sends only the cards whose health changed. The folder
// is polled every FPGA_POLL_MS milliseconds (default 500).
//
// Environment (devshim gives a driver exactly its drivers[] entry's env):
//
//	FPGA_REPORT_DIR   optional: where health reports appear
//	FPGA_POLL_MS      optional: the poll interval
//	FPGA_DEVICE_NODE  the host device node each card is granted as (default /dev/null,
//	                  since the card is made up)
package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"devshim.local/driver"
)

const (
	resource = "example.com/fpga"
	cdiKind  = "example.com/fpga"
)

// card is one FPGA as the driver knows it.
type card struct {
	id   string
	numa int32
}

var cards = []card{{"fpga-0", 0}, {"fpga-1", 0}, {"fpga-2", 1}, {"fpga-3", 1}}

type fpgaDriver struct {
	statusDir string
	poll      time.Duration
	hostNode  string

	mu     sync.Mutex
	health map[string]driver.Health
	done   chan struct{}
}

func (d *fpgaDriver) Resources() []driver.Resource {
	return []driver.Resource{{Name: resource, PreferredAllocation: true}}
}

func (d *fpgaDriver) ListDevices(ctx context.Context, _ string) ([]driver.Device, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	devices := make([]driver.Device, 0, len(cards))
	for _, c := range cards {
		model, firmware, numa := "Acme F4", "2.1.0", int64(c.numa)
		devices = append(devices, driver.Device{
			ID: c.id, Health: d.health[c.id], NUMANodes: []int32{c.numa},
			Attributes: map[string]driver.Attribute{
				"model": {String: &model}, "firmware": {Version: &firmware}, "numaNode": {Int: &numa},
			},
			Capacity: map[string]string{"memory": "8Gi"},
		})
	}
	return devices, nil
}

// Allocate gives each container its cards: a device node each, an env naming
// them all, and the CDI device of each (resolved through the spec shipped below).
func (d *fpgaDriver) Allocate(ctx context.Context, _ string, containers [][]string) ([]driver.Grant, error) {
	grants := make([]driver.Grant, 0, len(containers))
	for _, ids := range containers {
		grant := driver.Grant{Envs: map[string]string{"FPGA_VISIBLE_DEVICES": strings.Join(ids, ",")}}
		for _, id := range ids {
			if !slices.ContainsFunc(cards, func(c card) bool { return c.id == id }) {
				return nil, driver.UnknownDevice(resource, id)
			}
			grant.DeviceNodes = append(grant.DeviceNodes, d.node(id))
			grant.CDIDevices = append(grant.CDIDevices, cdiKind+"="+id)
		}
		grants = append(grants, grant)
	}
	return grants, nil
}

func (d *fpgaDriver) node(id string) driver.DeviceNode {
	return driver.DeviceNode{ContainerPath: "/dev/fpga/" + id, HostPath: d.hostNode, Permissions: "rw"}
}

// PreferredAllocation keeps a container's cards on one NUMA node where it can:
// the must-include cards' nodes first, then the node with most cards free.
func (d *fpgaDriver) PreferredAllocation(ctx context.Context, _ string, req driver.PreferenceRequest) ([]string, error) {
	numa := map[string]int32{}
	for _, c := range cards {
		numa[c.id] = c.numa
	}
	chosen := slices.Clone(req.MustInclude)
	home, free := map[int32]bool{}, map[int32]int{}
	for _, id := range chosen {
		home[numa[id]] = true
	}
	var rest []string
	for _, id := range req.Available {
		if !slices.Contains(chosen, id) {
			rest = append(rest, id)
			free[numa[id]]++
		}
	}
	slices.SortStableFunc(rest, func(a, b string) int {
		rank := func(id string) [2]int {
			away := 1
			if home[numa[id]] {
				away = 0
			}
			return [2]int{away, -free[numa[id]]}
		}
		ra, rb := rank(a), rank(b)
		if ra[0] != rb[0] {
			return ra[0] - rb[0]
		}
		return ra[1] - rb[1]
	})
	for _, id := range rest {
		if len(chosen) >= int(req.Size) {
			break
		}
		chosen = append(chosen, id)
	}
	return chosen, nil
}

// CDISpecs ships the spec of every card, so "example.com/fpga=fpga-N" resolves
// in the container runtime: devshim writes it into the node's CDI folder.
func (d *fpgaDriver) CDISpecs() []driver.CDISpec {
	spec := driver.CDISpec{Kind: cdiKind}
	for i, c := range cards {
		spec.Devices = append(spec.Devices, driver.CDISpecDevice{Name: c.id, Edits: &driver.CDIEdits{
			Envs:        map[string]string{"FPGA_SLOT": strconv.Itoa(i)},
			DeviceNodes: []driver.DeviceNode{d.node(c.id)},
		}})
	}
	return []driver.CDISpec{spec}
}

// Initialize reads the cards' health once, then polls it in the background.
func (d *fpgaDriver) Initialize(ctx context.Context, params *driver.InitializeParams, n *driver.Notifier) error {
	for _, a := range params.Allocations {
		fmt.Fprintf(os.Stderr, "in use after a restart: %s %v\n", a.Resource, a.DeviceIDs)
	}
	if d.statusDir != "" && d.done == nil {
		d.done = make(chan struct{})
		go d.watch(n)
	}
	return nil
}

// probe takes the reports in the folder: the cards' health after them (the caller holds mu).
func (d *fpgaDriver) probe() map[string]driver.Health {
	health := maps.Clone(d.health)
	for _, c := range cards {
		path := filepath.Join(d.statusDir, c.id)
		report, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		_ = os.Remove(path) // taken
		switch strings.TrimSpace(string(report)) {
		case "fault":
			health[c.id] = driver.Unhealthy
		case "ok":
			health[c.id] = driver.Healthy
		}
	}
	return health
}

// watch sends only the cards whose health changed, until serving ends.
func (d *fpgaDriver) watch(n *driver.Notifier) {
	defer close(d.done)
	ticker := time.NewTicker(d.poll)
	defer ticker.Stop()
	for {
		select {
		case <-n.Context().Done():
			return
		case <-ticker.C:
		}
		var changes []driver.HealthChange
		d.mu.Lock()
		now := d.probe()
		for _, c := range cards {
			if d.health[c.id] != now[c.id] {
				changes = append(changes, driver.HealthChange{ID: c.id, Health: now[c.id]})
			}
		}
		d.health = now
		d.mu.Unlock()
		if len(changes) == 0 {
			continue
		}
		if err := n.HealthChanged(n.Context(), resource, changes); err != nil {
			return // devshim has gone
		}
		_ = n.Log(n.Context(), driver.LogWarning, fmt.Sprintf("health changed: %v", changes))
	}
}

// Shutdown waits for the poller to stop (serving has ended, so it will).
func (d *fpgaDriver) Shutdown(ctx context.Context) error {
	if d.done != nil {
		<-d.done
	}
	return nil
}

func main() {
	d := &fpgaDriver{statusDir: os.Getenv("FPGA_REPORT_DIR"), poll: 500 * time.Millisecond, hostNode: "/dev/null"}
	if ms, err := strconv.Atoi(os.Getenv("FPGA_POLL_MS")); err == nil && ms > 0 {
		d.poll = time.Duration(ms) * time.Millisecond
	}
	if node := os.Getenv("FPGA_DEVICE_NODE"); node != "" {
		d.hostNode = node
	}
	d.health = map[string]driver.Health{}
	for _, c := range cards {
		d.health[c.id] = driver.Healthy
	}
	driver.Run(d, driver.Options{Name: "go-fpga", Version: "0.1.0"})
}

package harness

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"sync"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// A command line longer than this is refused: the Python side writes short ones.
const maxLine = 1 << 20

type allReady struct{}

func (allReady) AddSource(string) {}
func (allReady) AllReady() bool   { return true }

// harness holds one manager and the pods the node runs, as the kubelet would.
type harness struct {
	release Release
	manager *devicemanager.ManagerImpl
	plugins chan struct{} // closed to stop the plugin manager

	mu      sync.Mutex // pods and live are read by the manager's and the servers' goroutines
	pods    []*v1.Pod
	live    *devicemanager.ManagerImpl
	servers []*grpc.Server
}

// current is the running manager, for the PodResources server's goroutines.
func (h *harness) current() *devicemanager.ManagerImpl {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.live
}

// Main serves commands from stdin until "stop" or the end of stdin, then stops
// the manager. It returns the process exit status.
func Main(release Release) int {
	klog.InitFlags(nil)
	flag.Parse()
	h := &harness{release: release}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64*1024), maxLine)
	out := bufio.NewWriter(os.Stdout)
	defer h.stop()
	for in.Scan() {
		var req Request
		var reply Reply
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			reply = Reply{Error: "harness: not a request: " + err.Error()}
		} else {
			result, err := h.handle(&req)
			reply = Reply{ID: req.ID, OK: err == nil, Result: result}
			if err != nil {
				reply.Error = err.Error()
			}
		}
		_, _ = out.Write(encode(reply))
		_ = out.Flush()
		if req.Op == "stop" {
			return 0
		}
	}
	if err := in.Err(); err != nil && err != io.EOF {
		fmt.Fprintln(os.Stderr, "harness: reading commands:", err)
		return 1
	}
	return 0
}

func (h *harness) handle(req *Request) (any, error) {
	switch req.Op {
	case "version", "start", "stop":
	case "capacity", "allocatable", "admit", "run_options", "assigned", "hints", "remove_pod":
		if h.manager == nil {
			return nil, fmt.Errorf("%s before start", req.Op)
		}
	default:
		return nil, fmt.Errorf("unknown op %q", req.Op)
	}
	switch req.Op {
	case "version":
		return map[string]string{"release": linkedRelease()}, nil
	case "start":
		return nil, h.start(req)
	case "capacity":
		return h.capacity(), nil
	case "allocatable":
		return h.allocatable(), nil
	case "admit":
		if req.Pod == nil {
			return nil, fmt.Errorf("admit: no pod")
		}
		return h.admit(req.Pod)
	case "run_options":
		pod, c, err := h.container(req.PodUID, req.Container)
		if err != nil {
			return nil, err
		}
		opts, err := h.release.RunOptions(h.manager, pod, c)
		if err != nil {
			return nil, err
		}
		return runOptions(opts), nil
	case "assigned":
		return devices(h.manager.GetDevices(req.PodUID, req.Container)), nil
	case "hints":
		pod, c, err := h.container(req.PodUID, req.Container)
		if err != nil {
			return nil, err
		}
		return hints(h.release.Hints(h.manager, pod, c)), nil
	case "remove_pod":
		h.mu.Lock()
		defer h.mu.Unlock()
		h.pods = without(h.pods, req.PodUID)
		return nil, nil
	}
	return nil, h.stop() // "stop"
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*v1.Pod(nil), h.pods...)
}

func (h *harness) start(req *Request) error {
	if h.manager != nil {
		return fmt.Errorf("start: already started")
	}
	m, err := h.release.NewManager(req.NUMANodes, h.release.NewTopology())
	if err != nil {
		return fmt.Errorf("NewManagerImpl: %w", err)
	}
	containers := containermap.NewContainerMap()
	running := sets.New[string]()
	for _, p := range req.Pods {
		h.pods = append(h.pods, kubePod(&p))
	}
	for _, name := range req.Running {
		uid, container, ok := strings.Cut(name, "/")
		if !ok {
			return fmt.Errorf("start: running %q is not podUID/container", name)
		}
		containers.Add(uid, container, name)
		running.Insert(name)
	}
	if err := h.release.Start(m, h.activePods, allReady{}, containers, running); err != nil {
		return fmt.Errorf("Start: %w", err)
	}
	h.manager = m
	h.mu.Lock()
	h.live = m
	h.mu.Unlock()
	if req.PodResourcesSocket != "" {
		if err := h.servePodResources(req.PodResourcesSocket); err != nil {
			return err
		}
	}
	// The kubelet fetches the plugin watcher handler at every start, after the manager's
	// Start (which creates device-plugins/DEPRECATION in these releases), whether or not a
	// plugin ever registers through the watcher.
	handler := m.GetWatcherHandler()
	if req.WatcherDir != "" {
		pm := pluginmanager.NewPluginManager(req.WatcherDir, &record.FakeRecorder{})
		pm.AddHandler(pluginwatcherapi.DevicePlugin, handler)
		h.plugins = make(chan struct{})
		go h.release.RunPlugins(pm, allReady{}, h.plugins)
	}
	return nil
}

func (h *harness) stop() error {
	for _, server := range h.servers {
		server.Stop()
	}
	h.servers = nil
	if h.plugins != nil {
		close(h.plugins)
		h.plugins = nil
	}
	if h.manager == nil {
		return nil
	}
	m := h.manager
	h.manager = nil
	h.mu.Lock()
	h.live = nil
	h.mu.Unlock()
	return h.release.Stop(m)
}

// servePodResources serves the kubelet's own PodResources v1 server on a unix socket, as the
// kubelet serves /var/lib/kubelet/pod-resources/kubelet.sock.
func (h *harness) servePodResources(path string) error {
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("PodResources socket: %w", err)
	}
	server := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(server, h.release.PodResources(node{h}))
	h.servers = append(h.servers, server)
	go func() { _ = server.Serve(listener) }()
	return nil
}

// admit allocates as the kubelet's admission does: the pod is active while it is
// admitted, init containers first, and a pod that fails admission is not kept.
func (h *harness) admit(p *Pod) (map[string]map[string][]string, error) {
	pod := kubePod(p)
	h.mu.Lock()
	h.pods = append(without(h.pods, p.UID), pod)
	h.mu.Unlock()
	assigned := map[string]map[string][]string{}
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if err := h.release.Allocate(h.manager, pod, &list[i]); err != nil {
				h.mu.Lock()
				h.pods = without(h.pods, p.UID)
				h.mu.Unlock()
				return nil, err
			}
			assigned[list[i].Name] = deviceIDs(h.manager.GetDevices(p.UID, list[i].Name))
		}
	}
	return assigned, nil
}

func (h *harness) container(uid, name string) (*v1.Pod, *v1.Container, error) {
	for _, pod := range h.activePods() {
		if string(pod.UID) != uid {
			continue
		}
		for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
			for i := range list {
				if list[i].Name == name {
					return pod, &list[i], nil
				}
			}
		}
	}
	return nil, nil, fmt.Errorf("no active pod %s with a container %q", uid, name)
}

func (h *harness) capacity() Capacity {
	capacity, allocatable, removed := h.release.Capacity(h.manager)
	sort.Strings(removed)
	return Capacity{Capacity: counts(capacity), Allocatable: counts(allocatable), Removed: append([]string{}, removed...)}
}

func (h *harness) allocatable() map[string][]Device {
	return devices(h.release.Allocatable(h.manager))
}

func kubePod(p *Pod) *v1.Pod {
	pod := &v1.Pod{}
	pod.UID = types.UID(p.UID)
	pod.Name = p.Name
	pod.Namespace = p.Namespace
	pod.Spec.InitContainers = kubeContainers(p.InitContainers)
	pod.Spec.Containers = kubeContainers(p.Containers)
	return pod
}

func kubeContainers(cs []Container) []v1.Container {
	out := make([]v1.Container, 0, len(cs))
	for _, c := range cs {
		list := v1.ResourceList{}
		for name, n := range c.Requests {
			list[v1.ResourceName(name)] = *resource.NewQuantity(n, resource.DecimalSI)
		}
		out = append(out, v1.Container{Name: c.Name, Resources: v1.ResourceRequirements{Limits: list, Requests: list}})
	}
	return out
}

func without(pods []*v1.Pod, uid string) []*v1.Pod {
	kept := pods[:0:0]
	for _, pod := range pods {
		if string(pod.UID) != uid {
			kept = append(kept, pod)
		}
	}
	return kept
}

func counts(list v1.ResourceList) map[string]int64 {
	out := map[string]int64{}
	for name, q := range list {
		out[string(name)] = q.Value()
	}
	return out
}

func devices(instances devicemanager.ResourceDeviceInstances) map[string][]Device {
	out := map[string][]Device{}
	for name, byID := range instances {
		list := []Device{}
		for id, d := range byID {
			list = append(list, Device{ID: id, Health: d.Health, NUMA: numa(d.Topology)})
		}
		sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
		out[name] = list
	}
	return out
}

func deviceIDs(instances devicemanager.ResourceDeviceInstances) map[string][]string {
	out := map[string][]string{}
	for name, byID := range instances {
		ids := make([]string, 0, len(byID))
		for id := range byID {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		out[name] = ids
	}
	return out
}

func numa(t *pluginapi.TopologyInfo) []int64 {
	nodes := []int64{}
	if t != nil {
		for _, n := range t.Nodes {
			if n != nil {
				nodes = append(nodes, n.ID)
			}
		}
	}
	return nodes
}

// linkedRelease is the k8s.io/kubernetes version this binary was built with.
func linkedRelease() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/kubernetes" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

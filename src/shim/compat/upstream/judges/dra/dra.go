package dra

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
	"sync"
	"syscall"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/featuregate"
	"k8s.io/klog/v2"
)

// A command line longer than this is refused: the Python side writes short ones.
const maxLine = 1 << 20

// resumeEnv carries a restarted process's state (see restart) into the new process image.
const resumeEnv = "DEVSHIM_DRA_RESUME"

// Release is what differs between the releases this package is linked against.
type Release interface {
	// Gates are the feature gates the release's DRA manager needs set, by name; they are set
	// on the default mutable feature gate before anything starts.
	Gates() map[string]bool
	// Start constructs the release's DRA manager on env.StateDir and starts it as the kubelet
	// does, then runs a plugin manager on env.PluginsDir whose "DRAPlugin" handler is the
	// manager's own (GetWatcherHandler, fetched after Start, as the kubelet does), with every
	// call on it reported to env.Calls; and passes the manager's health updates to env.Notified.
	// Everything it starts ends when ctx is done.
	Start(ctx context.Context, env Env) (Manager, error)
}

// Manager is one release's DRA manager, its calls in one shape.
type Manager interface {
	Prepare(ctx context.Context, pod *v1.Pod) error
	Unprepare(ctx context.Context, pod *v1.Pod) error
	// CDIDevices is GetResources: the CDI device IDs the runtime gets for the container.
	CDIDevices(pod *v1.Pod, c *v1.Container) ([]string, error)
	// Health is UpdateAllocatedResourcesStatus on status; false where the release has none.
	Health(pod *v1.Pod, status *v1.PodStatus) bool
	// Stop is the manager's own Stop where it has one (1.37), after ctx is done.
	Stop()
}

// Env is what the kubelet gives its DRA manager and plugin manager, as the harness holds it.
type Env struct {
	Client     kubernetes.Interface
	NodeName   string
	StateDir   string
	PluginsDir string
	// ActivePods is the pods prepared (or passed at start) and not unprepared since.
	ActivePods func() []*v1.Pod
	// GetNode reads the Node named NodeName from the API server (the kubelet's node lister):
	// the manager wipes that node's ResourceSlices at start and after a driver goes away,
	// once the Node exists.
	GetNode func(ctx context.Context) (*v1.Node, error)
	// Ready says every pod source is ready, as it is for a kubelet that has synced.
	Ready AllReady
	Calls *Calls
	// Notified is given the pods of each health update (Updates(), 1.34 on).
	Notified func(podUIDs []string)
	// Stop is closed when the harness stops (the plugin manager's stop channel).
	Stop <-chan struct{}
}

// AllReady is a config.SourcesReady whose sources are always ready.
type AllReady struct{}

func (AllReady) AddSource(string) {}
func (AllReady) AllReady() bool   { return true }

// Calls records the plugin manager's calls on the DRA handler; each Release's handler wrapper
// calls these around the real handler's methods, passing on what they return.
type Calls struct {
	mu    sync.Mutex
	calls []Call
}

func (c *Calls) add(call Call) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, call)
}

func (c *Calls) list() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Call{}, c.calls...)
}

// Validate records a ValidatePlugin call and returns its error.
func (c *Calls) Validate(driver, endpoint string, versions []string, err error) error {
	c.add(Call{Op: "validate", Driver: driver, Endpoint: endpoint, Versions: list(versions), Error: text(err)})
	return err
}

// Register records a RegisterPlugin call and returns its error.
func (c *Calls) Register(driver, endpoint string, versions []string, err error) error {
	c.add(Call{Op: "register", Driver: driver, Endpoint: endpoint, Versions: list(versions), Error: text(err)})
	return err
}

// Deregister records a DeRegisterPlugin call.
func (c *Calls) Deregister(driver, endpoint string) {
	c.add(Call{Op: "deregister", Driver: driver, Endpoint: endpoint, Versions: []string{}})
}

// harness holds one manager and the pods the node runs, as the kubelet would.
type harness struct {
	release Release
	started *Request // the start request, kept for restart
	manager Manager
	cancel  context.CancelFunc
	stop    chan struct{}
	calls   *Calls

	mu       sync.Mutex // pods and notified are read by the manager's goroutines
	pods     []*v1.Pod
	wire     map[string]Pod // the pods as given, by UID, for restart
	notified map[string]bool
}

// Main serves commands from stdin until "stop" or the end of stdin. It returns the process
// exit status.
func Main(release Release) int {
	klog.InitFlags(nil)
	flag.Parse()
	h := &harness{release: release, calls: &Calls{}, wire: map[string]Pod{}, notified: map[string]bool{}}
	out := bufio.NewWriter(os.Stdout)
	reply := func(id int64, result any, err error) {
		r := Reply{ID: id, OK: err == nil, Result: result}
		if err != nil {
			r.Error = err.Error()
		}
		_, _ = out.Write(encode(r))
		_ = out.Flush()
	}
	defer h.shutdown()
	if state, ok := os.LookupEnv(resumeEnv); ok {
		_ = os.Unsetenv(resumeEnv)
		id, result, err := h.resume(state)
		reply(id, result, err)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64*1024), maxLine)
	for in.Scan() {
		var req Request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			reply(0, nil, fmt.Errorf("dramanager: not a request: %w", err))
			continue
		}
		result, err := h.handle(&req)
		reply(req.ID, result, err)
		if req.Op == "stop" {
			return 0
		}
	}
	if err := in.Err(); err != nil && err != io.EOF {
		fmt.Fprintln(os.Stderr, "dramanager: reading commands:", err)
		return 1
	}
	return 0
}

func (h *harness) handle(req *Request) (any, error) {
	switch req.Op {
	case "version", "start", "stop", "registrations":
	case "prepare", "resources", "health", "unprepare", "restart":
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
		return h.start(req)
	case "registrations":
		return h.calls.list(), nil
	case "prepare":
		if req.Pod == nil {
			return nil, errors.New("prepare: no pod")
		}
		pod := h.activate(*req.Pod)
		// The pod stays active when preparing fails: the kubelet's pod worker would try again.
		return nil, h.manager.Prepare(h.context(), pod)
	case "resources":
		pod, c, err := h.container(req.PodUID, req.Container)
		if err != nil {
			return nil, err
		}
		ids, err := h.manager.CDIDevices(pod, c)
		if err != nil {
			return nil, err
		}
		return resolveCDI(h.started.CDIDirs, ids), nil
	case "health":
		pod, err := h.pod(req.PodUID)
		if err != nil {
			return nil, err
		}
		return h.health(pod), nil
	case "unprepare":
		pod, err := h.pod(req.PodUID)
		if err != nil {
			return nil, err
		}
		if err := h.manager.Unprepare(h.context(), pod); err != nil {
			return nil, err
		}
		h.deactivate(req.PodUID)
		return nil, nil
	case "restart":
		return nil, h.restart(req.ID)
	}
	h.shutdown() // "stop"
	return nil, nil
}

// context is a fresh context carrying klog's logger, as the kubelet's pod workers pass one.
func (h *harness) context() context.Context {
	return klog.NewContext(context.Background(), klog.Background())
}

func (h *harness) start(req *Request) (any, error) {
	if h.manager != nil {
		return nil, errors.New("start: already started")
	}
	for _, field := range []struct{ name, value string }{
		{"kubeconfig", req.Kubeconfig}, {"node_name", req.NodeName},
		{"state_dir", req.StateDir}, {"plugins_dir", req.PluginsDir},
	} {
		if field.value == "" {
			return nil, fmt.Errorf("start: no %s", field.name)
		}
	}
	gates := h.release.Gates()
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(gates); err != nil {
		return nil, fmt.Errorf("start: feature gates: %w", err)
	}
	config, err := clientcmd.BuildConfigFromFlags("", req.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("start: kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("start: client: %w", err)
	}
	for _, p := range req.Pods {
		h.activate(p)
	}
	ctx, cancel := context.WithCancel(h.context())
	stop := make(chan struct{})
	env := Env{
		Client: client, NodeName: req.NodeName, StateDir: req.StateDir, PluginsDir: req.PluginsDir,
		ActivePods: h.activePods,
		GetNode: func(ctx context.Context) (*v1.Node, error) {
			return client.CoreV1().Nodes().Get(ctx, req.NodeName, metav1.GetOptions{})
		},
		Calls: h.calls, Notified: h.notify, Stop: stop,
	}
	m, err := h.release.Start(ctx, env)
	if err != nil {
		cancel()
		close(stop)
		return nil, err
	}
	h.manager, h.cancel, h.stop, h.started = m, cancel, stop, req
	enabled := map[string]bool{}
	for name := range gates {
		enabled[name] = utilfeature.DefaultFeatureGate.Enabled(featuregate.Feature(name))
	}
	return map[string]any{"release": linkedRelease(), "gates": enabled}, nil
}

// shutdown stops the plugin manager and the manager's background work, then the manager.
func (h *harness) shutdown() {
	if h.manager == nil {
		return
	}
	h.cancel()
	close(h.stop)
	h.manager.Stop()
	h.manager = nil
}

// resumeState is what a restarted process starts from: the start request, the active pods
// and the id of the restart request it answers.
type resumeState struct {
	ID    int64   `json:"id"`
	Start Request `json:"start"`
	Pods  []Pod   `json:"pods"`
}

// restart is a kubelet restart: the process replaces itself (same pid, same stdin, stdout and
// stderr) with a fresh image of the same program, which starts a new manager and plugin
// manager on the same state dir and answers the request. In-process state that a restarted
// kubelet would not keep (1.33 keeps its registered plugins in a package variable) is gone,
// as it would be. Nothing is stopped first: a kubelet going down does not unprepare anything.
func (h *harness) restart(id int64) error {
	h.mu.Lock()
	state := resumeState{ID: id, Start: *h.started}
	for _, pod := range h.pods {
		state.Pods = append(state.Pods, h.wire[string(pod.UID)])
	}
	h.mu.Unlock()
	state.Start.Pods = nil
	encoded, err := json.Marshal(state)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	klog.Flush()
	err = syscall.Exec(self, os.Args, append(os.Environ(), resumeEnv+"="+string(encoded)))
	return fmt.Errorf("restart: exec %s: %w", self, err) // Exec returns only when it failed
}

func (h *harness) resume(encoded string) (int64, any, error) {
	var state resumeState
	if err := json.Unmarshal([]byte(encoded), &state); err != nil {
		return 0, nil, fmt.Errorf("restart: the state passed on: %w", err)
	}
	state.Start.Pods = state.Pods
	if _, err := h.start(&state.Start); err != nil {
		return state.ID, nil, fmt.Errorf("restart: %w", err)
	}
	return state.ID, map[string]int{"pid": os.Getpid()}, nil
}

func (h *harness) activate(p Pod) *v1.Pod {
	pod := kubePod(&p)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pods = append(without(h.pods, p.UID), pod)
	h.wire[p.UID] = p
	return pod
}

func (h *harness) deactivate(uid string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pods = without(h.pods, uid)
	delete(h.wire, uid)
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*v1.Pod(nil), h.pods...)
}

func (h *harness) notify(uids []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, uid := range uids {
		h.notified[uid] = true
	}
}

func (h *harness) pod(uid string) (*v1.Pod, error) {
	for _, pod := range h.activePods() {
		if string(pod.UID) == uid {
			return pod, nil
		}
	}
	return nil, fmt.Errorf("no active pod %s", uid)
}

func (h *harness) container(uid, name string) (*v1.Pod, *v1.Container, error) {
	pod, err := h.pod(uid)
	if err != nil {
		return nil, nil, err
	}
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return pod, &list[i], nil
			}
		}
	}
	return nil, nil, fmt.Errorf("active pod %s has no container %q", uid, name)
}

// health asks the manager for the pod's status as the kubelet's status manager does: a status
// with one entry per container, which the manager fills in.
func (h *harness) health(pod *v1.Pod) Health {
	status := &v1.PodStatus{}
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{Name: c.Name})
	}
	out := Health{Containers: map[string][]v1.ResourceStatus{}, Notified: []string{}}
	out.Supported = h.manager.Health(pod, status)
	if !out.Supported {
		return out
	}
	for _, s := range status.ContainerStatuses {
		out.Containers[s.Name] = append([]v1.ResourceStatus{}, s.AllocatedResourcesStatus...)
	}
	h.mu.Lock()
	for uid := range h.notified {
		out.Notified = append(out.Notified, uid)
	}
	h.mu.Unlock()
	sort.Strings(out.Notified)
	return out
}

func kubePod(p *Pod) *v1.Pod {
	pod := &v1.Pod{}
	pod.UID = types.UID(p.UID)
	pod.Name = p.Name
	pod.Namespace = p.Namespace
	for _, c := range p.ResourceClaims {
		claim := v1.PodResourceClaim{Name: c.Name}
		if c.ResourceClaimName != "" {
			claim.ResourceClaimName = ptr(c.ResourceClaimName)
		}
		if c.ResourceClaimTemplateName != "" {
			claim.ResourceClaimTemplateName = ptr(c.ResourceClaimTemplateName)
			status := v1.PodResourceClaimStatus{Name: c.Name}
			if c.GeneratedName != "" {
				status.ResourceClaimName = ptr(c.GeneratedName)
			}
			pod.Status.ResourceClaimStatuses = append(pod.Status.ResourceClaimStatuses, status)
		}
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, claim)
	}
	pod.Spec.InitContainers = kubeContainers(p.InitContainers)
	pod.Spec.Containers = kubeContainers(p.Containers)
	return pod
}

func kubeContainers(cs []Container) []v1.Container {
	out := make([]v1.Container, 0, len(cs))
	for _, c := range cs {
		container := v1.Container{Name: c.Name}
		for _, claim := range c.Claims {
			container.Resources.Claims = append(container.Resources.Claims, v1.ResourceClaim{Name: claim.Name, Request: claim.Request})
		}
		out = append(out, container)
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

func ptr(s string) *string { return &s }

func list(versions []string) []string { return append([]string{}, versions...) }

func text(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
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

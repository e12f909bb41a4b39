// Package dra drives the kubelet's real DRA manager (k8s.io/kubernetes pkg/kubelet/cm/dra) and
// its real plugin manager (pkg/kubelet/pluginmanager) over stdin and stdout, one JSON object per
// line, so devshim's Python side (shim.compat.upstream.dra_manager) can judge a DRA kubelet
// plugin with the kubelet's own code.
//
// Every release module that carries a `dramanager` program (../../k8s-1.NN/dramanager) links
// this package against its own k8s.io/kubernetes and passes a Release: the constructor, Start,
// the plugin handler and the health call, whose signatures differ between releases. The
// protocol is the same for all of them:
//
//	{"id":1,"op":"start","kubeconfig":"...","node_name":"node-a","state_dir":"...",
//	 "plugins_dir":"...","cdi_dirs":["..."],"pods":[POD...]}  -> {"release":"v1.37.2","gates":{...}}
//	{"id":2,"op":"registrations"}                              -> [CALL...]
//	{"id":3,"op":"prepare","pod":POD}                          -> null, or the manager's error
//	{"id":4,"op":"resources","pod_uid":"u1","container":"c"}   -> RESOURCES
//	{"id":5,"op":"health","pod_uid":"u1"}                      -> HEALTH
//	{"id":6,"op":"unprepare","pod_uid":"u1"}                   -> null, or the manager's error
//	{"id":7,"op":"restart"}                                    -> {"pid":N} (a fresh process)
//	{"id":8,"op":"stop"}                                       -> null, then the process exits
//	{"id":9,"op":"version"}                                    -> {"release":"v1.37.2"}
//
// Each reply is {"id":N,"ok":true,"result":...} or {"id":N,"ok":false,"error":"text"}.
package dra

import (
	"encoding/json"

	v1 "k8s.io/api/core/v1"
)

// Request is one command line on stdin.
type Request struct {
	ID int64  `json:"id"`
	Op string `json:"op"`
	// start: what a kubelet is configured with. The manager keeps its checkpoint in StateDir
	// (the kubelet's root dir); the plugin manager watches PluginsDir (plugins_registry); a
	// container's CDI device IDs are resolved from the CDI specs in CDIDirs (what the container
	// runtime would read; none: /etc/cdi and /var/run/cdi are NOT read). Pods are the pods
	// already active, as a restarted kubelet knows them.
	Kubeconfig string   `json:"kubeconfig,omitempty"`
	NodeName   string   `json:"node_name,omitempty"`
	StateDir   string   `json:"state_dir,omitempty"`
	PluginsDir string   `json:"plugins_dir,omitempty"`
	CDIDirs    []string `json:"cdi_dirs,omitempty"`
	Pods       []Pod    `json:"pods,omitempty"`
	// prepare: the pod, active from then on (until it is unprepared).
	Pod *Pod `json:"pod,omitempty"`
	// resources, health, unprepare: an active pod, and for resources one of its containers.
	PodUID    string `json:"pod_uid,omitempty"`
	Container string `json:"container,omitempty"`
}

// Reply answers the request of the same id: Result on success, Error otherwise.
type Reply struct {
	ID     int64  `json:"id"`
	OK     bool   `json:"ok"`
	Error  string `json:"error,omitempty"`
	Result any    `json:"result,omitempty"`
}

// Pod is what the DRA manager reads of a pod: identity, spec.resourceClaims, and each
// container's resources.claims.
type Pod struct {
	UID            string      `json:"uid"`
	Name           string      `json:"name"`
	Namespace      string      `json:"namespace"`
	ResourceClaims []PodClaim  `json:"resource_claims,omitempty"`
	InitContainers []Container `json:"init_containers,omitempty"`
	Containers     []Container `json:"containers"`
}

// PodClaim is one entry of spec.resourceClaims: a claim by name, or one made from a template,
// whose generated name (status.resourceClaimStatuses, written by the claim controller) is
// GeneratedName; a template without one has no claim yet.
type PodClaim struct {
	Name                      string `json:"name"`
	ResourceClaimName         string `json:"resource_claim_name,omitempty"`
	ResourceClaimTemplateName string `json:"resource_claim_template_name,omitempty"`
	GeneratedName             string `json:"generated_name,omitempty"`
}

// Container names the pod claims it uses (resources.claims), each whole or one request of it.
type Container struct {
	Name   string           `json:"name"`
	Claims []ContainerClaim `json:"claims,omitempty"`
}

// ContainerClaim is one entry of a container's resources.claims.
type ContainerClaim struct {
	Name    string `json:"name"`
	Request string `json:"request,omitempty"`
}

// Call is one call the plugin manager made on the DRA manager's plugin handler, in order.
type Call struct {
	Op       string   `json:"op"` // "validate", "register" or "deregister"
	Driver   string   `json:"driver"`
	Endpoint string   `json:"endpoint"`
	Versions []string `json:"versions"` // the plugin's supported_versions (none for deregister)
	Error    string   `json:"error"`    // what the handler returned ("": accepted)
}

// Resources is what the manager hands the runtime for one container (GetResources: CDI device
// IDs), and those IDs resolved by the CDI library as a container runtime would, injected into
// an empty OCI spec: its process env, linux devices and their cgroup rules, mounts and hooks.
// CDIError is the library's error (an unresolvable ID, an invalid spec); the edits are then
// empty.
type Resources struct {
	CDIDevices     []string     `json:"cdi_devices"`
	Env            []string     `json:"env"`
	Devices        []DeviceNode `json:"devices"`
	DeviceRules    []DeviceRule `json:"device_rules"`
	Mounts         []Mount      `json:"mounts"`
	Hooks          []Hook       `json:"hooks"`
	AdditionalGIDs []uint32     `json:"additional_gids"`
	CDIError       string       `json:"cdi_error"`
}

// DeviceNode is one linux.devices entry of the OCI spec.
type DeviceNode struct {
	Path     string  `json:"path"`
	Type     string  `json:"type"`
	Major    int64   `json:"major"`
	Minor    int64   `json:"minor"`
	FileMode *uint32 `json:"file_mode"`
	UID      *uint32 `json:"uid"`
	GID      *uint32 `json:"gid"`
}

// DeviceRule is one linux.resources.devices (device cgroup) entry of the OCI spec.
type DeviceRule struct {
	Allow  bool   `json:"allow"`
	Type   string `json:"type"`
	Major  *int64 `json:"major"`
	Minor  *int64 `json:"minor"`
	Access string `json:"access"`
}

// Mount is one mounts entry of the OCI spec.
type Mount struct {
	Destination string   `json:"destination"`
	Source      string   `json:"source"`
	Type        string   `json:"type"`
	Options     []string `json:"options"`
}

// Hook is one OCI hook, with the stage it runs at ("prestart", "createRuntime", ...).
type Hook struct {
	Stage string   `json:"stage"`
	Path  string   `json:"path"`
	Args  []string `json:"args"`
	Env   []string `json:"env"`
}

// Health is what the manager writes into the pod's status for each container
// (UpdateAllocatedResourcesStatus: containerStatuses[].allocatedResourcesStatus, as the
// Kubernetes API spells it), and the pods its health updates named since start. Supported is
// false where the release's manager has no health (1.33): then both are empty.
type Health struct {
	Supported  bool                           `json:"supported"`
	Containers map[string][]v1.ResourceStatus `json:"containers"`
	Notified   []string                       `json:"notified"`
}

func encode(v any) []byte {
	line, err := json.Marshal(v)
	if err != nil {
		line, _ = json.Marshal(Reply{Error: "dramanager: cannot encode a reply: " + err.Error()})
	}
	return append(line, '\n')
}

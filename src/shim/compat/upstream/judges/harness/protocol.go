// Package harness drives the kubelet's real device manager (k8s.io/kubernetes
// pkg/kubelet/cm/devicemanager) over stdin and stdout, one JSON object per line, so
// devshim's Python side can judge a device plugin with the kubelet's own code.
//
// Every release module (../k8s-1.NN) links this package against its own
// k8s.io/kubernetes and passes a Release: the few calls whose signatures
// differ between releases. The protocol is the same for all of them.
package harness

import "encoding/json"

// Request is one command line on stdin: {"id": 3, "op": "admit", ...}.
type Request struct {
	ID int64  `json:"id"`
	Op string `json:"op"`
	// start: the pods already on the node and the containers the runtime runs,
	// as the kubelet passes them after a restart; watcher_dir runs the plugin
	// manager on that plugins_registry directory as well.
	Pods       []Pod    `json:"pods,omitempty"`
	Running    []string `json:"running,omitempty"` // "podUID/container"
	WatcherDir string   `json:"watcher_dir,omitempty"`
	// start: the machine's NUMA nodes, 0 to NUMANodes-1, as cadvisor would report them
	// (the topology hints are made over these); 0: no topology.
	NUMANodes int `json:"numa_nodes,omitempty"`
	// start: serve the kubelet's PodResources v1 API on this unix socket ("": none).
	PodResourcesSocket string `json:"pod_resources_socket,omitempty"`
	// admit
	Pod *Pod `json:"pod,omitempty"`
	// run_options, assigned, hints, remove_pod
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

// Pod is what the device manager reads of a pod: identity and device requests.
type Pod struct {
	UID            string      `json:"uid"`
	Name           string      `json:"name"`
	Namespace      string      `json:"namespace"`
	InitContainers []Container `json:"init_containers,omitempty"`
	Containers     []Container `json:"containers"`
}

// Container asks for a count of each extended resource (limits equal requests).
type Container struct {
	Name     string           `json:"name"`
	Requests map[string]int64 `json:"requests,omitempty"`
}

// Capacity is GetCapacity's answer: device counts per resource, and the
// resources this very call removed (their endpoint stopped more than the
// manager's grace period ago; each is reported once, then gone from the counts).
type Capacity struct {
	Capacity    map[string]int64 `json:"capacity"`
	Allocatable map[string]int64 `json:"allocatable"`
	Removed     []string         `json:"removed"`
}

// Device is one device as the manager keeps it.
type Device struct {
	ID     string  `json:"id"`
	Health string  `json:"health"`
	NUMA   []int64 `json:"numa"`
}

// RunOptions is GetDeviceRunContainerOptions' answer, what the runtime would get.
type RunOptions struct {
	Envs        map[string]string `json:"envs"`
	Mounts      []Mount           `json:"mounts"`
	Devices     []DeviceNode      `json:"devices"`
	Annotations map[string]string `json:"annotations"`
	CDIDevices  []string          `json:"cdi_devices"`
}

// Mount is one bind mount for the container.
type Mount struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	ReadOnly      bool   `json:"read_only"`
}

// DeviceNode is one device node for the container.
type DeviceNode struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	Permissions   string `json:"permissions"`
}

// Hint is one topology hint for a resource.
type Hint struct {
	NUMA      []int `json:"numa"`
	Preferred bool  `json:"preferred"`
}

func encode(v any) []byte {
	line, err := json.Marshal(v)
	if err != nil {
		line, _ = json.Marshal(Reply{Error: "harness: cannot encode a reply: " + err.Error()})
	}
	return append(line, '\n')
}

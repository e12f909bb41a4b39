package harness

import (
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

func runOptions(o *devicemanager.DeviceRunContainerOptions) RunOptions {
	out := RunOptions{Envs: map[string]string{}, Mounts: []Mount{}, Devices: []DeviceNode{},
		Annotations: map[string]string{}, CDIDevices: []string{}}
	if o == nil {
		return out
	}
	for _, e := range o.Envs {
		out.Envs[e.Name] = e.Value
	}
	for _, m := range o.Mounts {
		out.Mounts = append(out.Mounts, Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range o.Devices {
		out.Devices = append(out.Devices, DeviceNode{HostPath: d.PathOnHost, ContainerPath: d.PathInContainer, Permissions: d.Permissions})
	}
	for _, a := range o.Annotations {
		out.Annotations[a.Name] = a.Value
	}
	for _, c := range o.CDIDevices {
		out.CDIDevices = append(out.CDIDevices, c.Name)
	}
	return out
}

func hints(byResource map[string][]topologymanager.TopologyHint) map[string][]Hint {
	out := map[string][]Hint{}
	for name, list := range byResource {
		hs := []Hint{}
		for _, h := range list {
			nodes := []int{}
			if h.NUMANodeAffinity != nil {
				nodes = h.NUMANodeAffinity.GetBits()
			}
			hs = append(hs, Hint{NUMA: nodes, Preferred: h.Preferred})
		}
		out[name] = hs
	}
	return out
}

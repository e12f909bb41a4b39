package harness

import (
	v1 "k8s.io/api/core/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// Node is what the kubelet's PodResources server reads, as the harness holds it: the pods and
// the devices the manager assigned. Each Release wraps it in that release's provider
// interfaces (pkg/kubelet/apis/podresources/types.go), whose signatures drift.
type Node interface {
	Pods() []*v1.Pod
	PodByName(namespace, name string) (*v1.Pod, bool)
	// Devices is what a container holds, as the kubelet's container manager converts it.
	Devices(podUID, containerName string) []*podresourcesapi.ContainerDevices
	AllocatableDevices() []*podresourcesapi.ContainerDevices
	UpdateAllocatedDevices()
}

type node struct{ h *harness }

func (n node) Pods() []*v1.Pod { return n.h.activePods() }

func (n node) PodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range n.h.activePods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

func (n node) Devices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	if m := n.h.current(); m != nil {
		return containerDevices(m.GetDevices(podUID, containerName))
	}
	return nil
}

func (n node) AllocatableDevices() []*podresourcesapi.ContainerDevices {
	if m := n.h.current(); m != nil {
		return containerDevices(n.h.release.Allocatable(m))
	}
	return nil
}

func (n node) UpdateAllocatedDevices() {
	if m := n.h.current(); m != nil {
		n.h.release.UpdateAllocatedDevices(m)
	}
}

// containerDevices lists each device with its NUMA nodes, one entry per device.
func containerDevices(instances devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resource, byID := range instances {
		for id, device := range byID {
			entry := &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}}
			if device.Topology != nil {
				entry.Topology = &podresourcesapi.TopologyInfo{}
				for _, n := range device.Topology.Nodes {
					entry.Topology.Nodes = append(entry.Topology.Nodes, &podresourcesapi.NUMANode{ID: n.ID})
				}
			}
			out = append(out, entry)
		}
	}
	return out
}

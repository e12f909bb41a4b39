// Package providers holds the PodResources server's providers over a harness.Node for the
// releases whose provider interfaces (pkg/kubelet/apis/podresources/types.go) take no logger:
// 1.30 to 1.36. It compiles only against those releases; 1.37 has its own.
package providers

import (
	v1 "k8s.io/api/core/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"devshim.example/judges/harness"
)

// Upto136 is every provider at once: the node's pods (the harness keeps only active ones, so
// GetActivePods, which 1.36 added, is GetPods) and devices; no CPU, memory or DRA assignments.
type Upto136 struct{ harness.Node }

func (p Upto136) GetPods() []*v1.Pod       { return p.Pods() }
func (p Upto136) GetActivePods() []*v1.Pod { return p.Pods() }

func (p Upto136) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	return p.PodByName(namespace, name)
}

func (p Upto136) GetDevices(podUID, containerName string) []*podresourcesv1.ContainerDevices {
	return p.Devices(podUID, containerName)
}

func (p Upto136) GetAllocatableDevices() []*podresourcesv1.ContainerDevices {
	return p.AllocatableDevices()
}

func (Upto136) GetCPUs(string, string) []int64 { return nil }
func (Upto136) GetAllocatableCPUs() []int64    { return nil }

func (Upto136) GetMemory(string, string) []*podresourcesv1.ContainerMemory { return nil }
func (Upto136) GetAllocatableMemory() []*podresourcesv1.ContainerMemory    { return nil }

func (Upto136) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesv1.DynamicResource {
	return nil
}

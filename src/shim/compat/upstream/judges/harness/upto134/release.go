// Package upto134 is the harness.Release of k8s.io/kubernetes up to v1.33, whose
// device manager calls take neither a logger nor a context. The release modules
// of 1.30 to 1.33 use it as it is (1.34's PodResources server takes a context, so
// its module has a release of its own); it compiles only against those releases.
package upto134

import (
	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"

	"devshim.example/judges/harness"
	"devshim.example/judges/harness/providers"
)

// Release implements harness.Release for 1.30 to 1.34.
type Release struct{}

func (Release) NewTopology() topologymanager.Manager { return topologymanager.NewFakeManager() }

func (Release) NewManager(numaNodes int, store topologymanager.Store) (*devicemanager.ManagerImpl, error) {
	numa := make([]cadvisorapi.Node, numaNodes)
	for id := range numa {
		numa[id].Id = id
	}
	return devicemanager.NewManagerImpl(numa, store)
}

func (Release) Start(m *devicemanager.ManagerImpl, pods devicemanager.ActivePodsFunc, ready config.SourcesReady,
	containers containermap.ContainerMap, running sets.Set[string]) error {
	return m.Start(pods, ready, containers, running)
}

func (Release) Stop(m *devicemanager.ManagerImpl) error { return m.Stop() }

func (Release) Allocate(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) error {
	return m.Allocate(pod, c)
}

func (Release) RunOptions(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return m.GetDeviceRunContainerOptions(pod, c)
}

func (Release) Capacity(m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return m.GetCapacity()
}

func (Release) Allocatable(m *devicemanager.ManagerImpl) devicemanager.ResourceDeviceInstances {
	return m.GetAllocatableDevices()
}

func (Release) Hints(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) map[string][]topologymanager.TopologyHint {
	return m.GetTopologyHints(pod, c)
}

func (Release) RunPlugins(pm pluginmanager.PluginManager, ready config.SourcesReady, stop <-chan struct{}) {
	pm.Run(ready, stop)
}

func (Release) UpdateAllocatedDevices(m *devicemanager.ManagerImpl) { m.UpdateAllocatedDevices() }

func (Release) PodResources(n harness.Node) podresourcesv1.PodResourcesListerServer {
	p := providers.Upto136{Node: n}
	return podresources.NewV1PodResourcesServer(podresources.PodResourcesProviders{
		Pods: p, Devices: p, Cpus: p, Memory: p, DynamicResources: p,
	})
}

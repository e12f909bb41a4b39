// The kubelet's device manager of k8s.io/kubernetes v1.34, driven over stdin and
// stdout (../../harness). Its device manager calls are those of 1.30 to 1.33 (no
// logger, no context), but 1.34's PodResources server takes a context, so the
// harness's upto134 package does not compile here: this is its release, whole.
package main

import (
	"context"
	"os"

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

type release struct{}

func (release) NewTopology() topologymanager.Manager { return topologymanager.NewFakeManager() }

func (release) NewManager(numaNodes int, store topologymanager.Store) (*devicemanager.ManagerImpl, error) {
	numa := make([]cadvisorapi.Node, numaNodes)
	for id := range numa {
		numa[id].Id = id
	}
	return devicemanager.NewManagerImpl(numa, store)
}

func (release) Start(m *devicemanager.ManagerImpl, pods devicemanager.ActivePodsFunc, ready config.SourcesReady,
	containers containermap.ContainerMap, running sets.Set[string]) error {
	return m.Start(pods, ready, containers, running)
}

func (release) Stop(m *devicemanager.ManagerImpl) error { return m.Stop() }

func (release) Allocate(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) error {
	return m.Allocate(pod, c)
}

func (release) RunOptions(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return m.GetDeviceRunContainerOptions(pod, c)
}

func (release) Capacity(m *devicemanager.ManagerImpl) (v1.ResourceList, v1.ResourceList, []string) {
	return m.GetCapacity()
}

func (release) Allocatable(m *devicemanager.ManagerImpl) devicemanager.ResourceDeviceInstances {
	return m.GetAllocatableDevices()
}

func (release) Hints(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) map[string][]topologymanager.TopologyHint {
	return m.GetTopologyHints(pod, c)
}

func (release) RunPlugins(pm pluginmanager.PluginManager, ready config.SourcesReady, stop <-chan struct{}) {
	pm.Run(ready, stop)
}

func (release) UpdateAllocatedDevices(m *devicemanager.ManagerImpl) { m.UpdateAllocatedDevices() }

func (release) PodResources(n harness.Node) podresourcesv1.PodResourcesListerServer {
	p := providers.Upto136{Node: n}
	return podresources.NewV1PodResourcesServer(context.Background(), podresources.PodResourcesProviders{
		Pods: p, Devices: p, Cpus: p, Memory: p, DynamicResources: p,
	})
}

func main() { os.Exit(harness.Main(release{})) }

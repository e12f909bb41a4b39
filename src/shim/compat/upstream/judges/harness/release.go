package harness

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// Release is what differs between the releases this package is linked against:
// the calls that gained a logger, a context or an operation. Each release module
// implements it in a few lines; everything else is the same code for all.
type Release interface {
	NewTopology() topologymanager.Manager
	// NewManager is NewManagerImpl on a machine of numaNodes NUMA nodes, 0 to numaNodes-1, as
	// cadvisor would report them (1.37 moved cadvisor's Node to another package).
	NewManager(numaNodes int, store topologymanager.Store) (*devicemanager.ManagerImpl, error)
	Start(m *devicemanager.ManagerImpl, pods devicemanager.ActivePodsFunc, ready config.SourcesReady,
		containers containermap.ContainerMap, running sets.Set[string]) error
	Stop(m *devicemanager.ManagerImpl) error
	Allocate(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) error
	RunOptions(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error)
	Capacity(m *devicemanager.ManagerImpl) (capacity, allocatable v1.ResourceList, removed []string)
	Allocatable(m *devicemanager.ManagerImpl) devicemanager.ResourceDeviceInstances
	Hints(m *devicemanager.ManagerImpl, pod *v1.Pod, c *v1.Container) map[string][]topologymanager.TopologyHint
	RunPlugins(pm pluginmanager.PluginManager, ready config.SourcesReady, stop <-chan struct{})
	UpdateAllocatedDevices(m *devicemanager.ManagerImpl)
	// PodResources is the kubelet's PodResources v1 server over the node (its providers).
	PodResources(n Node) podresourcesv1.PodResourcesListerServer
}

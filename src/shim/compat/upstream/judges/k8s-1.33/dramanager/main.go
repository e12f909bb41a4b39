// The kubelet's DRA manager and plugin manager of k8s.io/kubernetes v1.33, driven over stdin
// and stdout (../../dra). In 1.33 the manager is ManagerImpl, its constructor takes the node's
// name, it reads ResourceClaims through resource.k8s.io/v1beta1, speaks DRAPlugin v1beta1 (or
// v1alpha4) to plugins, keeps registered plugins in a package variable, and has no health.
package main

import (
	"context"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	pluginregistration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/features"
	kubeletdra "k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"

	"devshim.example/judges/dra"
)

type release struct{}

// Gates: DynamicResourceAllocation is beta and off by default in 1.33. Its manager has no
// health, so ResourceHealthStatus (alpha) would change nothing here.
func (release) Gates() map[string]bool {
	return map[string]bool{string(features.DynamicResourceAllocation): true}
}

func (release) Start(ctx context.Context, env dra.Env) (dra.Manager, error) {
	m, err := kubeletdra.NewManagerImpl(env.Client, env.StateDir, types.NodeName(env.NodeName))
	if err != nil {
		return nil, err
	}
	getNode := func() (*v1.Node, error) { return env.GetNode(ctx) }
	if err := m.Start(ctx, env.ActivePods, getNode, env.Ready); err != nil {
		return nil, err
	}
	// After Start: the handler is made with the getNode that Start stored.
	plugins := pluginmanager.NewPluginManager(env.PluginsDir, &record.FakeRecorder{})
	plugins.AddHandler(pluginregistration.DRAPlugin, recording{m.GetWatcherHandler(), env.Calls})
	go plugins.Run(env.Ready, env.Stop)
	return manager{m}, nil
}

type manager struct{ m *kubeletdra.ManagerImpl }

func (m manager) Prepare(ctx context.Context, pod *v1.Pod) error {
	return m.m.PrepareResources(ctx, pod)
}

func (m manager) Unprepare(ctx context.Context, pod *v1.Pod) error {
	return m.m.UnprepareResources(ctx, pod)
}

func (m manager) CDIDevices(pod *v1.Pod, c *v1.Container) ([]string, error) {
	info, err := m.m.GetResources(pod, c)
	if err != nil {
		return nil, err
	}
	ids := []string{}
	for _, d := range info.CDIDevices {
		ids = append(ids, d.Name)
	}
	return ids, nil
}

func (manager) Health(*v1.Pod, *v1.PodStatus) bool { return false }

func (manager) Stop() {}

// recording is the manager's plugin handler, every call on it recorded.
type recording struct {
	cache.PluginHandler
	calls *dra.Calls
}

func (r recording) ValidatePlugin(name, endpoint string, versions []string) error {
	return r.calls.Validate(name, endpoint, versions, r.PluginHandler.ValidatePlugin(name, endpoint, versions))
}

func (r recording) RegisterPlugin(name, endpoint string, versions []string, timeout *time.Duration) error {
	return r.calls.Register(name, endpoint, versions, r.PluginHandler.RegisterPlugin(name, endpoint, versions, timeout))
}

func (r recording) DeRegisterPlugin(name, endpoint string) {
	r.PluginHandler.DeRegisterPlugin(name, endpoint)
	r.calls.Deregister(name, endpoint)
}

func main() { os.Exit(dra.Main(release{})) }

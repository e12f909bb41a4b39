// The kubelet's DRA manager and plugin manager of k8s.io/kubernetes v1.34, driven over stdin
// and stdout (../../dra). 1.34 made the constructor NewManager (a logger, no node name), reads
// ResourceClaims through resource.k8s.io/v1, speaks DRAPlugin v1 or v1beta1 (the first of the
// plugin's list it knows) and watches health (DRAResourceHealth v1alpha1) behind an alpha gate;
// its handler's calls, the plugin manager's Run and getNode take no context yet.
package main

import (
	"context"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginregistration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/features"
	kubeletdra "k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"

	"devshim.example/judges/dra"
)

type release struct{}

// Gates: DynamicResourceAllocation is GA (on); ResourceHealthStatus is alpha and off by default,
// turned on so the manager opens the health stream and reports health.
func (release) Gates() map[string]bool {
	return map[string]bool{string(features.ResourceHealthStatus): true}
}

func (release) Start(ctx context.Context, env dra.Env) (dra.Manager, error) {
	m, err := kubeletdra.NewManager(klog.FromContext(ctx), env.Client, env.StateDir)
	if err != nil {
		return nil, err
	}
	getNode := func() (*v1.Node, error) { return env.GetNode(ctx) }
	if err := m.Start(ctx, env.ActivePods, getNode, env.Ready); err != nil {
		return nil, err
	}
	go func() {
		for {
			select {
			case update := <-m.Updates():
				env.Notified(update.PodUIDs)
			case <-ctx.Done():
				return
			}
		}
	}()
	plugins := pluginmanager.NewPluginManager(env.PluginsDir, &record.FakeRecorder{})
	plugins.AddHandler(pluginregistration.DRAPlugin, recording{m.GetWatcherHandler(), env.Calls})
	go plugins.Run(env.Ready, env.Stop)
	return manager{m}, nil
}

type manager struct{ m *kubeletdra.Manager }

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

func (m manager) Health(pod *v1.Pod, status *v1.PodStatus) bool {
	m.m.UpdateAllocatedResourcesStatus(pod, status)
	return true
}

// Stop: 1.34's manager has none (its plugin manager ends with the context).
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

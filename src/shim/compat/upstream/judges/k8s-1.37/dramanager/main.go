// The kubelet's DRA manager and plugin manager of k8s.io/kubernetes v1.37, driven over stdin
// and stdout (../../dra). From 1.37 the plugin handler's calls, the plugin manager's
// Run, getNode and UpdateAllocatedResourcesStatus take a context or a logger, and the manager
// has a Stop.
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

// Gates: DynamicResourceAllocation is GA and locked on; ResourceHealthStatus is beta and on by
// default, set anyway so the health stream is certain to be used.
func (release) Gates() map[string]bool {
	return map[string]bool{string(features.ResourceHealthStatus): true}
}

func (release) Start(ctx context.Context, env dra.Env) (dra.Manager, error) {
	logger := klog.FromContext(ctx)
	m, err := kubeletdra.NewManager(logger, env.Client, env.StateDir)
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx, env.ActivePods, env.GetNode, env.Ready); err != nil {
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
	go plugins.Run(ctx, env.Ready, env.Stop)
	return manager{m, logger}, nil
}

type manager struct {
	m      *kubeletdra.Manager
	logger klog.Logger
}

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
	m.m.UpdateAllocatedResourcesStatus(m.logger, pod, status)
	return true
}

func (m manager) Stop() { m.m.Stop() }

// recording is the manager's plugin handler, every call on it recorded.
type recording struct {
	cache.PluginHandler
	calls *dra.Calls
}

func (r recording) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	return r.calls.Validate(name, endpoint, versions, r.PluginHandler.ValidatePlugin(ctx, name, endpoint, versions))
}

func (r recording) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string, timeout *time.Duration) error {
	return r.calls.Register(name, endpoint, versions, r.PluginHandler.RegisterPlugin(ctx, name, endpoint, versions, timeout))
}

func (r recording) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	r.PluginHandler.DeRegisterPlugin(ctx, name, endpoint)
	r.calls.Deregister(name, endpoint)
}

func main() { os.Exit(dra.Main(release{})) }

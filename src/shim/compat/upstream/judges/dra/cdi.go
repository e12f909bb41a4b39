package dra

import (
	"fmt"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// resolveCDI resolves the manager's CDI device IDs for one container as a container runtime
// does after the kubelet hands them over: a CDI cache over dirs (read now, no watching), the
// devices injected into an OCI spec. The spec starts empty, so everything in it is what the
// CDI specs added.
func resolveCDI(dirs []string, ids []string) Resources {
	out := Resources{
		CDIDevices: append([]string{}, ids...), Env: []string{}, Devices: []DeviceNode{},
		DeviceRules: []DeviceRule{}, Mounts: []Mount{}, Hooks: []Hook{}, AdditionalGIDs: []uint32{},
	}
	if len(ids) == 0 {
		return out
	}
	// WithSpecDirs replaces the default /etc/cdi and /var/run/cdi: only dirs are read.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(append([]string{}, dirs...)...), cdi.WithAutoRefresh(false))
	if err != nil {
		out.CDIError = err.Error()
		return out
	}
	spec := &oci.Spec{}
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		out.CDIError = err.Error() + specErrors(cache)
		return out
	}
	if spec.Process != nil {
		out.Env = append(out.Env, spec.Process.Env...)
		out.AdditionalGIDs = append(out.AdditionalGIDs, spec.Process.User.AdditionalGids...)
	}
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			node := DeviceNode{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor, UID: d.UID, GID: d.GID}
			if d.FileMode != nil {
				mode := uint32(*d.FileMode)
				node.FileMode = &mode
			}
			out.Devices = append(out.Devices, node)
		}
		if spec.Linux.Resources != nil {
			for _, r := range spec.Linux.Resources.Devices {
				out.DeviceRules = append(out.DeviceRules, DeviceRule{Allow: r.Allow, Type: r.Type, Major: r.Major, Minor: r.Minor, Access: r.Access})
			}
		}
	}
	for _, m := range spec.Mounts {
		out.Mounts = append(out.Mounts, Mount{Destination: m.Destination, Source: m.Source, Type: m.Type, Options: append([]string{}, m.Options...)})
	}
	if spec.Hooks != nil {
		stages := []struct {
			name  string
			hooks []oci.Hook
		}{
			{"prestart", spec.Hooks.Prestart}, {"createRuntime", spec.Hooks.CreateRuntime},
			{"createContainer", spec.Hooks.CreateContainer}, {"startContainer", spec.Hooks.StartContainer},
			{"poststart", spec.Hooks.Poststart}, {"poststop", spec.Hooks.Poststop},
		}
		for _, stage := range stages {
			for _, hook := range stage.hooks {
				out.Hooks = append(out.Hooks, Hook{Stage: stage.name, Path: hook.Path, Args: append([]string{}, hook.Args...), Env: append([]string{}, hook.Env...)})
			}
		}
	}
	return out
}

// specErrors is what the cache could not load (a spec that does not parse or validate), which
// is why a device in it is unresolvable.
func specErrors(cache *cdi.Cache) string {
	var lines []string
	for path, errs := range cache.GetErrors() {
		for _, err := range errs {
			lines = append(lines, fmt.Sprintf("%s: %v", path, err))
		}
	}
	if len(lines) == 0 {
		return ""
	}
	sort.Strings(lines)
	return "; the CDI specs' errors: " + strings.Join(lines, "; ")
}

package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// table is the method table: one handler per request of the schema's Driver service.
func (s *server) table() map[string]handler {
	pre, _ := s.driver.(PreStarter)
	dealloc, _ := s.driver.(Deallocator)
	post, _ := s.driver.(PostStopper)
	methods := map[string]handler{
		MethodInitialize:          s.initialize,
		MethodListDevices:         s.listDevices,
		MethodAllocate:            s.allocate,
		MethodPreferredAllocation: s.preferredAllocation,
		MethodAttach:              s.attach,
		MethodDetach:              s.detach,
		MethodShutdown:            s.shutdownRequest,
	}
	devicesMethods := map[string]func(context.Context, string, []string) error{}
	if pre != nil {
		devicesMethods[MethodPrestart] = pre.PreStart
	}
	if dealloc != nil {
		devicesMethods[MethodDeallocate] = dealloc.Deallocate
	}
	if post != nil {
		devicesMethods[MethodPostStop] = post.PostStop
	}
	for _, name := range []string{MethodPrestart, MethodDeallocate, MethodPostStop} {
		methods[name] = s.devicesMethod(name, devicesMethods[name])
	}
	return methods
}

// decode reads params into message; a refusal is CodeInvalidParams saying why.
func decode(method string, params json.RawMessage, message json.Unmarshaler) error {
	if len(params) == 0 || params[0] != '{' {
		return invalidParams(method, fmt.Errorf("expected an object, got %s", shown(params)))
	}
	if err := message.UnmarshalJSON(params); err != nil {
		return invalidParams(method, err)
	}
	return nil
}

// resource checks a request's resource: unknown is CodeUnknownResource; an optional method the
// resource does not declare (flag, the Go method, or both missing) is CodeMethodNotFound.
func (s *server) resource(name, optional string, implemented bool) error {
	for _, r := range s.driver.Resources() {
		if r.Name != name {
			continue
		}
		declared := map[string]bool{
			MethodPreferredAllocation: r.PreferredAllocation, MethodPrestart: r.Prestart,
			MethodDeallocate: r.Deallocate, MethodPostStop: r.PostStop, MethodAllocate: true,
			capabilityAdminAccess: r.AdminAccess, capabilityShares: r.Shares, MethodAttach: r.Attach,
		}
		if optional != "" && (!declared[optional] || !implemented) {
			return notImplemented(name, optional)
		}
		return nil
	}
	return unknownResource(name)
}

func (s *server) initialize(ctx context.Context, params json.RawMessage) (any, error) {
	var request InitializeParams
	if err := decode(MethodInitialize, params, &request); err != nil {
		return nil, err
	}
	if err := checkProtocolVersion(request.ProtocolVersion); err != nil {
		return nil, err
	}
	s.notify.open() // devshim takes notifications from here on, the hook's own included
	if init, ok := s.driver.(Initializer); ok {
		if err := init.Initialize(ctx, &request, s.notify); err != nil {
			return nil, err
		}
	}
	resources := s.driver.Resources()
	for _, problem := range capabilityMismatches(s.driver, s.opts.Name, resources) {
		s.logf("WARNING: %s", problem)
	}
	var specs []CDISpec
	if shipper, ok := s.driver.(CDISpecShipper); ok {
		specs = shipper.CDISpecs()
	}
	return &InitializeResult{
		ProtocolVersion: ProtocolVersion,
		Driver:          &DriverInfo{Name: s.opts.Name, Version: s.opts.Version},
		Resources:       resources,
		CDISpecs:        specs,
	}, nil
}

// checkProtocolVersion holds devshim's version to the protocol's rule: semver, majors equal.
func checkProtocolVersion(theirs string) error {
	if len(theirs) > 64 || !semver.MatchString(theirs) {
		return invalidParams(MethodInitialize, fmt.Errorf("protocol version %q is not a semantic version", shortened(theirs)))
	}
	mine := strings.SplitN(ProtocolVersion, ".", 2)[0]
	if strings.SplitN(theirs, ".", 2)[0] != mine {
		return Errorf(CodeInvalidRequest,
			"devshim speaks driver protocol %s, this driver %s: majors must be equal", theirs, ProtocolVersion)
	}
	return nil
}

func shortened(text string) string {
	if len(text) > 64 {
		return text[:64] + "..."
	}
	return text
}

func (s *server) listDevices(ctx context.Context, params json.RawMessage) (any, error) {
	var request ListDevicesParams
	if err := decode(MethodListDevices, params, &request); err != nil {
		return nil, err
	}
	if err := s.resource(request.Resource, "", true); err != nil {
		return nil, err
	}
	devices, err := s.driver.ListDevices(ctx, request.Resource)
	if err != nil {
		return nil, err
	}
	if err := checkDevices(devices); err != nil {
		return nil, err
	}
	return &ListDevicesResult{Devices: devices}, nil
}

func (s *server) allocate(ctx context.Context, params json.RawMessage) (any, error) {
	var request AllocateParams
	if err := decode(MethodAllocate, params, &request); err != nil {
		return nil, err
	}
	if len(request.Containers) > 0 && (request.Containers[0].AdminAccess || len(request.Containers[0].Shares) > 0) {
		return s.allocateUnheld(ctx, request) // protocol 1.3: DRA, one container
	}
	allocator, ok := s.driver.(Allocator)
	if err := s.resource(request.Resource, MethodAllocate, ok); err != nil {
		return nil, err
	}
	containers := make([][]string, len(request.Containers))
	for i, c := range request.Containers {
		containers[i] = c.DeviceIDs
	}
	grants, err := allocator.Allocate(ctx, request.Resource, containers)
	if err != nil {
		return nil, err
	}
	if len(grants) != len(containers) { // devshim pairs grants with containers by position
		return nil, fmt.Errorf("Allocate returned %d grants for %d containers", len(grants), len(containers))
	}
	return &AllocateResult{Containers: grants}, nil
}

// The capabilities of protocol 1.3 that an allocate request asks for: each a Resource flag and an
// interface of its own, checked as an optional method is.
const (
	capabilityAdminAccess = "admin_access"
	capabilityShares      = "shares"
)

// allocateUnheld answers an allocate whose containers take no device for themselves: admin access
// or shares, every container alike.
func (s *server) allocateUnheld(ctx context.Context, request AllocateParams) (any, error) {
	admin, shared := request.Containers[0].AdminAccess, len(request.Containers[0].Shares) > 0
	for _, c := range request.Containers {
		if c.AdminAccess != admin || (len(c.Shares) > 0) != shared {
			return nil, invalidParams(MethodAllocate, fmt.Errorf("admin_access or shares is set on some containers but not all"))
		}
	}
	accessor, isAccessor := s.driver.(AdminAccessor)
	sharer, isSharer := s.driver.(Sharer)
	capability, implemented := capabilityAdminAccess, isAccessor
	if shared {
		capability, implemented = capabilityShares, isSharer
	}
	if err := s.resource(request.Resource, capability, implemented); err != nil {
		return nil, err
	}
	result := &AllocateResult{Containers: make([]Grant, len(request.Containers))}
	for i, c := range request.Containers {
		var err error
		if shared {
			result.Containers[i], err = sharer.Shares(ctx, request.Resource, c.Shares)
		} else {
			result.Containers[i], err = accessor.AdminAccess(ctx, request.Resource, c.DeviceIDs)
		}
		if err != nil {
			return nil, err
		}
	}
	return result, nil
}

func (s *server) preferredAllocation(ctx context.Context, params json.RawMessage) (any, error) {
	var request PreferredAllocationParams
	if err := decode(MethodPreferredAllocation, params, &request); err != nil {
		return nil, err
	}
	preferrer, ok := s.driver.(PreferredAllocator)
	if err := s.resource(request.Resource, MethodPreferredAllocation, ok); err != nil {
		return nil, err
	}
	result := &PreferredAllocationResult{Containers: make([]Preference, len(request.Containers))}
	for i, c := range request.Containers {
		chosen, err := preferrer.PreferredAllocation(ctx, request.Resource, c)
		if err != nil {
			return nil, err
		}
		result.Containers[i].DeviceIDs = chosen
	}
	return result, nil
}

func (s *server) attach(ctx context.Context, params json.RawMessage) (any, error) {
	var request AttachParams
	if err := decode(MethodAttach, params, &request); err != nil {
		return nil, err
	}
	attacher, ok := s.driver.(Attacher)
	if err := s.resource(request.Resource, MethodAttach, ok); err != nil {
		return nil, err
	}
	conditions, err := attacher.Attach(ctx, request.Resource, request.DeviceID, request.Claim, request.ClaimUID)
	if err != nil {
		return nil, err
	}
	return &AttachResult{Conditions: conditions}, nil
}

func (s *server) detach(ctx context.Context, params json.RawMessage) (any, error) {
	var request AttachParams
	if err := decode(MethodDetach, params, &request); err != nil {
		return nil, err
	}
	_, attaches := s.driver.(Attacher)
	if err := s.resource(request.Resource, MethodAttach, attaches); err != nil {
		return nil, err
	}
	if detacher, ok := s.driver.(Detacher); ok {
		if err := detacher.Detach(ctx, request.Resource, request.DeviceID, request.Claim, request.ClaimUID); err != nil {
			return nil, err
		}
	}
	return &Empty{}, nil
}

// devicesMethod handles prestart, deallocate or post_stop: call is nil when the driver does
// not implement it.
func (s *server) devicesMethod(method string, call func(context.Context, string, []string) error) handler {
	return func(ctx context.Context, params json.RawMessage) (any, error) {
		var request DevicesParams
		if err := decode(method, params, &request); err != nil {
			return nil, err
		}
		if err := s.resource(request.Resource, method, call != nil); err != nil {
			return nil, err
		}
		if err := call(ctx, request.Resource, request.DeviceIDs); err != nil {
			return nil, err
		}
		return &Empty{}, nil
	}
}

func (s *server) shutdownRequest(ctx context.Context, params json.RawMessage) (any, error) {
	var request ShutdownParams
	if err := decode(MethodShutdown, params, &request); err != nil {
		return nil, err
	}
	err := s.finish(ctx)
	s.closeOnce.Do(func() { close(s.shutdown) })
	if err != nil {
		return nil, err
	}
	return &Empty{}, nil
}

// capabilityMismatches says what an optional method and the resources' flags cannot both mean:
// a flag without its method (devshim's calls get "not implemented"), or a method no resource
// declares (devshim never calls it). A driver serving nothing yet is not judged.
func capabilityMismatches(d Driver, name string, resources []Resource) []string {
	_, pref := d.(PreferredAllocator)
	_, pre := d.(PreStarter)
	_, dealloc := d.(Deallocator)
	_, post := d.(PostStopper)
	_, admin := d.(AdminAccessor)
	_, sharer := d.(Sharer)
	_, attacher := d.(Attacher)
	checks := []struct {
		method, iface string
		implemented   bool
		flag          func(Resource) bool
	}{
		{MethodPreferredAllocation, "PreferredAllocator", pref, func(r Resource) bool { return r.PreferredAllocation }},
		{MethodPrestart, "PreStarter", pre, func(r Resource) bool { return r.Prestart }},
		{MethodDeallocate, "Deallocator", dealloc, func(r Resource) bool { return r.Deallocate }},
		{MethodPostStop, "PostStopper", post, func(r Resource) bool { return r.PostStop }},
		{capabilityAdminAccess, "AdminAccessor", admin, func(r Resource) bool { return r.AdminAccess }},
		{capabilityShares, "Sharer", sharer, func(r Resource) bool { return r.Shares }},
		{MethodAttach, "Attacher", attacher, func(r Resource) bool { return r.Attach }},
	}
	var problems []string
	for _, c := range checks {
		var declaring []string
		for _, r := range resources {
			if c.flag(r) {
				declaring = append(declaring, r.Name)
			}
		}
		switch {
		case len(declaring) > 0 && !c.implemented:
			for _, r := range declaring {
				problems = append(problems, fmt.Sprintf("%s declares %s but %s does not implement %s", r, c.method, name, c.iface))
			}
		case len(resources) > 0 && len(declaring) == 0 && c.implemented:
			problems = append(problems, fmt.Sprintf(
				"%s implements %s but no resource in Resources() sets %s: devshim will never call it", name, c.iface, c.method))
		}
	}
	return problems
}

// checkDevices refuses what devshim would refuse of a whole list, where the driver can see why.
func checkDevices(devices []Device) error {
	for _, d := range devices {
		for _, node := range d.NUMANodes {
			if node < 0 || node > MaxNUMANode {
				return fmt.Errorf("device %q: numa_nodes must be integers from 0 to %d, not %d "+
					"(sysfs's numa_node is -1 for a device without one: leave NUMANodes empty)", d.ID, MaxNUMANode, node)
			}
		}
		for name, a := range d.Attributes {
			set := 0
			for _, present := range []bool{a.Int != nil, a.Bool != nil, a.String != nil, a.Version != nil} {
				if present {
					set++
				}
			}
			if set != 1 {
				return fmt.Errorf("device %q: attribute %q must set exactly one of Int, Bool, String, Version", d.ID, name)
			}
		}
	}
	return nil
}

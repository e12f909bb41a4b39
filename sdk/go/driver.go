package driver

import "context"

// Driver is what every driver implements: the resources it serves and their
// devices. Everything else is an optional interface of its own, detected once
// when serving starts.
type Driver interface {
	// Resources are the resources served now, each with the optional methods
	// devshim may call for it (Resource.PreferredAllocation, Prestart,
	// Deallocate, PostStop). It is called for every request, to check the
	// request's resource: keep it cheap and safe to call from any goroutine.
	Resources() []Resource
	// ListDevices is the full device list of resource. A broken device stays
	// listed as Unhealthy: one left out is removed from the node.
	ListDevices(ctx context.Context, resource string) ([]Device, error)
}

// Allocator answers allocate: one grant per container, in order. devshim
// calls it when a requested device has no declared grant (Device.Grant), with
// only device IDs the driver listed as healthy. A driver whose every device
// declares its grant need not implement it.
type Allocator interface {
	Allocate(ctx context.Context, resource string, containers [][]string) ([]Grant, error)
}

// PreferredAllocator answers preferred_allocation for a resource that sets
// Resource.PreferredAllocation: req.Size device IDs of req.Available, every one
// of req.MustInclude among them. The answer is advice; devshim answers "no
// preference" when it fails or is late.
type PreferredAllocator interface {
	PreferredAllocation(ctx context.Context, resource string, req PreferenceRequest) ([]string, error)
}

// PreStarter answers prestart (the kubelet's PreStartContainer, which allows
// 30 s) for a resource that sets Resource.Prestart.
type PreStarter interface {
	PreStart(ctx context.Context, resource string, deviceIDs []string) error
}

// Deallocator answers deallocate (devices freed) for a resource that sets
// Resource.Deallocate.
type Deallocator interface {
	Deallocate(ctx context.Context, resource string, deviceIDs []string) error
}

// AdminAccessor answers an allocate for a DRA claim with admin access
// (protocol 1.3) for a resource that sets Resource.AdminAccess: the devices
// may be in use by other claims and stay theirs, so grant what monitoring or
// management needs and take nothing. No prestart or deallocate follows.
type AdminAccessor interface {
	AdminAccess(ctx context.Context, resource string, deviceIDs []string) (Grant, error)
}

// Sharer answers an allocate for shares of devices that allow multiple
// allocations (protocol 1.3, DRA consumable capacity) for a resource that sets
// Resource.Shares: each share names its device, its share ID and the capacity
// it consumes. The devices stay with their other shares: no prestart or
// deallocate follows.
type Sharer interface {
	Shares(ctx context.Context, resource string, shares []DeviceShare) (Grant, error)
}

// Attacher answers attach (protocol 1.4, DRA binding conditions) for a
// resource that sets Resource.Attach: the scheduler allocated deviceID, whose
// Device.Binding names conditions, to claim ("namespace/name"). Attach it and
// answer how its conditions stand; devshim writes them into the claim's
// status, and the pod binds once every condition is true.
type Attacher interface {
	Attach(ctx context.Context, resource, deviceID, claim, claimUID string) ([]BindingCondition, error)
}

// Detacher answers detach (protocol 1.4) for a resource that sets
// Resource.Attach: the allocation Attach was called for is gone (its claim
// freed or deleted, whether or not a pod used the device). Undo what Attach
// did; devshim asks until answered, also after a restart, so detaching a
// device that is not attached must succeed. Without it, detach does nothing.
type Detacher interface {
	Detach(ctx context.Context, resource, deviceID, claim, claimUID string) error
}

// PostStopper answers post_stop (a container stopped) for a resource that sets
// Resource.PostStop.
type PostStopper interface {
	PostStop(ctx context.Context, resource string, deviceIDs []string) error
}

// CDISpecShipper names the CDI specs the driver ships (protocol 1.2): devshim
// writes them into the node's CDI folder at every initialize, so the CDI names
// its grants give ("kind=name") resolve in the container runtime.
type CDISpecShipper interface {
	CDISpecs() []CDISpec
}

// Initializer runs before the initialize answer. params.Allocations lists the
// devices devshim knows to be in use, so a restarted driver can rebuild its
// state. Start background work here, with n to send notifications (devshim
// takes them from now on) and n.Context() to know when serving ends.
type Initializer interface {
	Initialize(ctx context.Context, params *InitializeParams, n *Notifier) error
}

// Shutdowner runs once, on shutdown or when devshim has gone (stdin closed, or
// Serve's context cancelled): stop background work, release the hardware.
type Shutdowner interface {
	Shutdown(ctx context.Context) error
}

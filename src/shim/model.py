"""The version-neutral device model.

Every kubelet API version is translated to and from these types at the edge
(shim/deviceplugin/<version>.py); the core and the device sources see nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType


class Health(StrEnum):
    # The exact strings the kubelet compares against (upstream constants.go).
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


# The highest NUMA node ID any source may give (driver lists, static settings, the SDK): Linux's
# MAX_NUMNODES is 1 << CONFIG_NODES_SHIFT, and x86-64, arm64 and powerpc allow NODES_SHIFT 10 at
# most, so IDs run 0..1023. The kubelet's NUMANode.ID is an int64; without this bound sysfs's -1
# read as uint64 (2**64-1) got into a list, and encoding it for the kubelet failed.
MAX_NUMA_NODE = 1023


class AttributeKind(StrEnum):
    # The JSON field names of a DRA DeviceAttribute (resource.k8s.io, every version).
    INT = "int"
    BOOL = "bool"
    STRING = "string"
    VERSION = "version"


@dataclass(frozen=True, slots=True)
class Attribute:
    """One typed attribute value, as DRA publishes it (shim/dra/slices.py)."""

    kind: AttributeKind
    value: int | bool | str


@dataclass(frozen=True, slots=True)
class Device:
    id: str
    health: Health = Health.HEALTHY
    numa_nodes: tuple[int, ...] = ()
    # Protocol 1.1, for DRA: (name, value) pairs sorted by name, so equal devices compare equal.
    attributes: tuple[tuple[str, Attribute], ...] = ()
    capacity: tuple[tuple[str, str], ...] = ()  # (name, quantity), sorted by name
    taints: tuple[DeviceTaint, ...] = ()  # protocol 1.3, for DRA, in the driver's order
    # Protocol 1.3, partitionable devices (DRA): the counter sets this device brings to its pool,
    # and what taking it uses up of them.
    counter_sets: tuple[CounterSet, ...] = ()
    consumes_counters: tuple[CounterSet, ...] = ()
    allow_multiple_allocations: bool = False  # protocol 1.3: claims may share it (DRA)
    # (capacity, how shares consume it), sorted: its requestPolicy.
    capacity_policies: tuple[tuple[str, CapacityPolicy], ...] = ()
    binding: DeviceBinding | None = None  # protocol 1.4: an attach step before a pod binds (DRA)


@dataclass(frozen=True, slots=True)
class CapacityPolicy:
    """How the shares of a device claims may share consume one capacity (resource.k8s.io's
    CapacityRequestPolicy): ``default`` for a share asking for none, and at most one of the amounts
    a share may take, ``valid_values``, or the range (min, max, step; max and step may be "")."""

    default: str
    valid_values: tuple[str, ...] = ()
    valid_range: tuple[str, str, str] | None = None


@dataclass(frozen=True, slots=True)
class DeviceBinding:
    """What the scheduler waits for before binding a pod to the device's node (DRA binding
    conditions): every one of ``conditions`` True in the claim's status, none of ``failure_conditions``."""

    conditions: tuple[str, ...]
    failure_conditions: tuple[str, ...]
    binds_to_node: bool = False


@dataclass(frozen=True, slots=True)
class BindingCondition:
    """How one of a device's binding conditions stands, as its driver's attach answered."""

    type: str
    status: bool
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class CounterSet:
    """Named counters: a pool's shared set, or what one device consumes of the set so named."""

    name: str
    counters: tuple[tuple[str, str], ...]  # (counter, quantity), sorted by counter


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """A claim's share of a device that allows multiple allocations (DRA consumable capacity)."""

    device_id: str
    share_id: str
    consumed_capacity: tuple[tuple[str, str], ...] = ()  # (capacity, quantity), sorted


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """resource.k8s.io's DeviceTaint, less the time the API server stamps."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A host device node exposed in the container (v1beta1 calls it DeviceSpec)."""

    container_path: str
    host_path: str
    permissions: str = "rw"


def _frozen_map(value: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True, slots=True)
class ContainerAllocateRequest:
    device_ids: tuple[str, ...]
    admin_access: bool = False  # DRA's adminAccess: the devices may be in use and stay so
    shares: tuple[DeviceShare, ...] = ()  # DRA's shared allocations: one per device, or none


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    """What a container gets for its devices: the answer to one ContainerAllocateRequest."""

    envs: Mapping[str, str] = field(default_factory=_frozen_map)
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=_frozen_map)
    cdi_devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Freeze mappings handed in as plain dicts, so a grant can be shared safely.
        object.__setattr__(self, "envs", _frozen_map(self.envs))
        object.__setattr__(self, "annotations", _frozen_map(self.annotations))

    def __hash__(self) -> int:
        # By value, as equality is: mappings are equal whatever their order, so their items hash
        # as sets (a tuple of them would give equal grants built in another order another hash).
        maps = frozenset(self.envs.items()), frozenset(self.annotations.items())
        return hash((maps, self.mounts, self.device_nodes, self.cdi_devices))


@dataclass(frozen=True, slots=True)
class CdiSpecDevice:
    """One device of a CDI spec a driver ships: its name and the edits granting it amounts to
    (envs, mounts and device nodes; nothing else has a place in a spec devshim writes)."""

    name: str
    edits: ContainerGrant


@dataclass(frozen=True, slots=True)
class CdiSpec:
    """A CDI spec a driver ships (protocol 1.2): devshim writes it for the container runtime, so
    the CDI names the driver grants, ``kind=name``, resolve on the node."""

    kind: str
    devices: tuple[CdiSpecDevice, ...]


@dataclass(frozen=True, slots=True)
class PreferredAllocationRequest:
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Optional behaviours of a device source, turned into the kubelet's plugin options."""

    preferred_allocation: bool = False
    pre_start: bool = False
    # Offered to kubelets through v1beta2's options (experimental); on v1beta1,
    # deallocate is emulated through PodResources.
    deallocate: bool = False
    post_stop: bool = False
    # Protocol 1.3: prepares DRA admin-access claims (devices in use by others stay theirs).
    admin_access: bool = False
    # Protocol 1.3: prepares shares of devices that allow multiple allocations (DRA).
    shares: bool = False
    # Protocol 1.4: attaches devices with binding conditions once allocated (DRA).
    attach: bool = False

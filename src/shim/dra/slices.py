"""A pool of devices as the ResourceSlices that publish it, in each resource.k8s.io version.

Pure: the publisher (shim/dra/publisher.py) decides when to write; this says what. The shapes,
from k8s.io/api's resource/<version>/types.go:

| version | a device's attributes and capacity | spec.nodeName | served by default |
|---|---|---|---|
| v1 | on the device; capacity `{value: q}` | optional | 1.34 on |
| v1beta2 | on the device; capacity `{value: q}` | optional | never (1.33 on, opt-in) |
| v1beta1 | under `basic`; capacity `{value: q}` | a string | never (1.32 on, opt-in) |
| v1alpha3 | under `basic`; capacity a bare quantity | a string | never (1.31-1.33) |

Device taints (protocol 1.3) sit beside the attributes in every version from 1.33 on; an API
server whose DRADeviceTaints gate is off (alpha in 1.33-1.35, beta and on in 1.36) drops them
without an error, which ``dropped`` finds in what it answers. A slice with a tainted device holds
at most 64 devices (1.37's ResourceSliceMaxDevicesWithAdvancedFeatures; fine on older ones too).

Partitionable devices (protocol 1.3) take 1.36's shape: the pool's counter sets in slices of their
own (`sharedCounters`, no `devices`, at most 8 a slice), each device's `consumesCounters` beside
its attributes, 64 devices a slice once one consumes counters. 1.33-1.35 had another shape (the
sets in the slice of the devices consuming them, at most 32 counters over a slice's sets) behind an
alpha gate off by default: to such a server devshim writes that shape (``beside``), each set with
every device consuming it, packed into as few slices as the limits allow; a server with the gate
off drops both, said so as dropped. Older servers, or a pool that cannot take that shape (a set
with its consumers past one slice's limits), get the devices without counters (``partitions``
False), said so too.

Consumable capacity (protocol 1.3): a device several claims may share carries
`allowMultipleAllocations: true` (v1beta1 on, 1.34 on; the DRAConsumableCapacity gate, alpha and
off in 1.34-1.35, beta and on in 1.36); its capacities are then what the shares consume.

Binding conditions (protocol 1.4): `bindingConditions`, `bindingFailureConditions` and
`bindsToNode` beside the attributes (v1beta1 on, 1.34 on; the DRADeviceBindingConditions gate,
alpha and off in 1.34-1.35, beta and on in 1.36). Published only for a DRA driver whose config
sets `binding_conditions` (``bindings``): devshim then watches its claims (shim/dra/binding.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc

from shim.dra.names import collisions, device_name
from shim.driverprotocol import MAX_ATTRIBUTES_AND_CAPACITIES
from shim.errors import ShimError
from shim.model import CapacityPolicy, CounterSet, Device

GROUP = "resource.k8s.io"
# Newest first: the publisher takes the first the API server serves.
VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
MAX_DEVICES_PER_SLICE = 128  # ResourceSliceMaxDevices
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures
MAX_COUNTER_SETS_PER_SLICE = 8  # ResourceSliceMaxCounterSets
PARTITIONS_SINCE = 36  # the first release with 1.36's shape of partitionable devices
BESIDE_SINCE = 33  # 1.33-1.35: counter sets beside their devices, behind the alpha gate
MAX_SHARED_COUNTERS_BESIDE = 32  # ResourceSliceMaxSharedCounters: counters over a slice's sets
MAX_DEVICE_COUNTERS_BESIDE = 1024  # ResourceSliceMaxDeviceCountersPerSlice
MAX_COUNTERS_PER_DEVICE_BESIDE = 32  # ResourceSliceMaxCountersPerDevice
PARTITIONS = "DRAPartitionableDevices"
BINDINGS = "DRADeviceBindingConditions"
# What a device may carry that an API server drops where its feature gate is off, by the gate.
GATED = {
    "taints": "DRADeviceTaints",
    "consumesCounters": PARTITIONS,
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "bindingConditions": BINDINGS,
}
# What the publisher writes on each slice: the hash of the spec it meant (the API server
# rewrites quantities in canonical form, so the spec read back cannot be compared as written).
SPEC_HASH = "devshim.dev/spec-hash"
MANAGED_BY = "devshim.dev/managed-by"
# The standard attribute of a device's NUMA node (k8s.io/dynamic-resource-allocation
# deviceattribute, 1.37): an int, the physical node. Published for a device the driver puts on one
# NUMA node, the device plugin's topology hint (a legacy plugin's only fact about a device).
NUMA_NODE = "resource.kubernetes.io/numaNode"


class NameCollision(ShimError):
    """Two device IDs of one pool map to one DRA device name: a device list that cannot be
    published as it is (as ListNotEncodable, INTERNAL). ``Pool.of``'s; the publisher itself takes
    pools already named (``Pool.named``), a clash decided by shim/dra/ownership.py."""

    status = grpc.StatusCode.INTERNAL


@dataclass(frozen=True, slots=True)
class PoolDevice:
    name: str
    device: Device
    resource: str = ""  # whose device (shim/dra/ownership.py): counter sets are owned by resource


@dataclass(frozen=True, slots=True)
class Pool:
    """One DRA driver's devices on one node, sorted by device name."""

    driver: str
    node: str
    devices: tuple[PoolDevice, ...]
    partitions: bool = True  # counter sets and their consumption published (1.36's shape)
    bindings: bool = False  # binding conditions published (the DRA driver's binding_conditions)
    beside: bool = False  # counter sets in their devices' slices (1.33-1.35's shape)

    @classmethod
    def of(cls, driver: str, node: str, devices: Iterable[Device]) -> Pool:
        """Every device, healthy or not (health reaches the kubelet another way: docs/dra.md)."""
        listed = list(devices)
        clash = collisions([d.id for d in listed])
        if clash:
            said = "; ".join(f"{', '.join(map(repr, ids))} -> {n!r}" for n, ids in sorted(clash.items()))
            raise NameCollision(f"device IDs meet in one DRA device name: {said}")
        return cls.named(driver, node, (PoolDevice(device_name(d.id), d) for d in listed))

    @classmethod
    def named(
        cls,
        driver: str,
        node: str,
        devices: Iterable[PoolDevice],
        partitions: bool = True,
        bindings: bool = False,
        beside: bool = False,
    ) -> Pool:
        """Devices already named, each name once (shim/dra/ownership.py decided who keeps it), in
        the configured order of their resources, which also decides who owns a counter set.
        ``beside``: in 1.33-1.35's shape, or, where the pool cannot take it, without counters."""
        entries = _counters_owned(list(devices))
        pool = cls(driver, node, tuple(sorted(entries, key=_name)), partitions, bindings, beside)
        if partitions and beside and _beside_chunks(pool) is None:
            return replace(pool, partitions=False)
        return pool

    def counter_sets(self) -> tuple[CounterSet, ...]:
        """The counter sets the pool's devices bring, by name (each brought by one resource alone:
        ``named``)."""
        found: dict[str, CounterSet] = {}
        for entry in self.devices:
            for counter_set in entry.device.counter_sets:
                found.setdefault(counter_set.name, counter_set)
        return tuple(found[name] for name in sorted(found))

    def counters_unpublished(self) -> bool:
        """Counters the pool has but does not publish here (``partitions`` off)."""
        return not self.partitions and any(
            d.device.counter_sets or d.device.consumes_counters for d in self.devices
        )

    def bindings_unpublished(self) -> bool:
        """Binding conditions the pool's devices have but devshim's config does not publish."""
        return not self.bindings and any(d.device.binding for d in self.devices)

    def chunks(self) -> list[Chunk]:
        """The devices of each slice, then the counter sets of each; a pool with neither is one
        empty slice (so that a scheduler sees the pool, complete and empty)."""
        devices = self.devices
        advanced = any(d.device.taints or (self.partitions and d.device.consumes_counters) for d in devices)
        size = MAX_DEVICES_PER_SLICE_WITH_TAINTS if advanced else MAX_DEVICES_PER_SLICE
        if self.partitions and self.beside:
            beside = _beside_chunks(self)
            assert beside is not None  # named() publishes such a pool without counters
            return beside or [()]
        chunks: list[Chunk] = [devices[i : i + size] for i in range(0, len(devices), size)]
        if self.partitions:
            sets, per = self.counter_sets(), MAX_COUNTER_SETS_PER_SLICE
            chunks += [sets[i : i + per] for i in range(0, len(sets), per)]
        return chunks or [()]


# One slice's content: devices, or counter sets (a slice has one or the other, from 1.36 on), or
# in 1.33-1.35's shape devices and the sets they consume.
Chunk = tuple[PoolDevice, ...] | tuple[CounterSet, ...] | tuple[PoolDevice | CounterSet, ...]


def _beside_chunks(pool: Pool) -> list[Chunk] | None:
    """1.33-1.35's slices: each counter set with every device consuming it (and the sets those
    devices consume too), packed first-fit; None where a set and its consumers exceed one slice.
    A consumer of a set no device brings is left out (unallocatable, as in 1.36's shape)."""
    sets = {c.name: c for c in pool.counter_sets()}
    parent = {name: name for name in sets}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    plain, consumers = [], []
    for entry in pool.devices:
        uses = entry.device.consumes_counters
        if not uses:
            plain.append(entry)
        elif all(u.name in sets for u in uses):
            if sum(len(u.counters) for u in uses) > MAX_COUNTERS_PER_DEVICE_BESIDE:
                return None
            consumers.append(entry)
            for use in uses[1:]:
                parent[root(use.name)] = root(uses[0].name)
    groups: dict[str, tuple[list[CounterSet], list[PoolDevice]]] = {}
    for name, counter_set in sets.items():
        groups.setdefault(root(name), ([], []))[0].append(counter_set)
    for entry in consumers:
        groups[root(entry.device.consumes_counters[0].name)][1].append(entry)
    size = MAX_DEVICES_PER_SLICE_WITH_TAINTS
    bins: list[tuple[list[CounterSet], list[PoolDevice], list[int]]] = []  # sets, devices, counts

    def need(group: tuple[list[CounterSet], list[PoolDevice]]) -> list[int]:
        group_sets, group_devices = group
        return [
            len(group_devices),
            sum(len(c.counters) for c in group_sets),
            sum(len(u.counters) for d in group_devices for u in d.device.consumes_counters),
        ]

    limits = [size, MAX_SHARED_COUNTERS_BESIDE, MAX_DEVICE_COUNTERS_BESIDE]
    for group in sorted(groups.values(), key=need, reverse=True):
        wanted = need(group)
        if any(w > limit for w, limit in zip(wanted, limits, strict=True)):
            return None
        fits = next(
            (b for b in bins if all(c + w <= m for c, w, m in zip(b[2], wanted, limits, strict=True))), None
        )
        if fits is None:
            bins.append((list(group[0]), list(group[1]), wanted))
        else:
            fits[0].extend(group[0])
            fits[1].extend(group[1])
            fits[2][:] = [c + w for c, w in zip(fits[2], wanted, strict=True)]
    chunks: list[Chunk] = [(*sorted(b[1], key=_name), *sorted(b[0], key=lambda c: c.name)) for b in bins]
    return chunks + [tuple(plain[i : i + size]) for i in range(0, len(plain), size)]


def _name(device: PoolDevice) -> str:
    return device.name


def _counters_owned(entries: list[PoolDevice]) -> list[PoolDevice]:
    """The devices with counter sets as their resources may have them: a set's name belongs to the
    first resource (in the configured order, as a device name does: ownership.py) whose device
    brings it, and to the first such device; a later device loses the set it names again, and a
    device of another resource may not consume it (else a hostile driver listed later could
    redefine, or use up, an honest driver's counters)."""
    owner: dict[str, tuple[str, int]] = {}  # set name -> (resource, index of the device bringing it)
    for i, entry in enumerate(entries):
        for counter_set in entry.device.counter_sets:
            owner.setdefault(counter_set.name, (entry.resource, i))
    if not owner:
        return entries  # most pools: nothing to decide
    kept = []
    for i, entry in enumerate(entries):
        device = entry.device
        sets = tuple(c for c in device.counter_sets if owner[c.name] == (entry.resource, i))
        # A set nobody brings now (its device held by a container, say) keeps its consumers
        # unallocatable: their consumption stays.
        mine = (entry.resource, -1)
        uses = tuple(c for c in device.consumes_counters if owner.get(c.name, mine)[0] == entry.resource)
        if sets != device.counter_sets or uses != device.consumes_counters:
            entry = replace(entry, device=replace(device, counter_sets=sets, consumes_counters=uses))
        kept.append(entry)
    return kept


def spec(
    pool: Pool, chunk: Sequence[PoolDevice | CounterSet], generation: int, count: int, version: str
) -> dict[str, Any]:
    """One slice's spec in ``version``: devices, or counter sets, or (1.33-1.35) both."""
    written: dict[str, Any] = {
        "driver": pool.driver,
        "pool": {"name": pool.node, "generation": generation, "resourceSliceCount": count},
        "nodeName": pool.node,
    }
    sets = [_counters(c, "name") for c in chunk if isinstance(c, CounterSet)]
    devices = [
        _device(d, version, pool.partitions, pool.bindings) for d in chunk if isinstance(d, PoolDevice)
    ]
    if sets:
        written["sharedCounters"] = sets
    if devices or not sets or pool.beside:
        written["devices"] = devices
    return written


def _counters(counter_set: CounterSet, key: str) -> dict[str, Any]:
    return {key: counter_set.name, "counters": {name: {"value": q} for name, q in counter_set.counters}}


def _device(
    entry: PoolDevice, version: str, partitions: bool = True, bindings: bool = False
) -> dict[str, Any]:
    device = entry.device
    attributes = {name: {a.kind.value: a.value} for name, a in device.attributes}
    if (
        len(device.numa_nodes) == 1
        and NUMA_NODE not in attributes
        and len(attributes) + len(device.capacity) < MAX_ATTRIBUTES_AND_CAPACITIES
    ):
        attributes[NUMA_NODE] = {"int": device.numa_nodes[0]}
    if version == "v1alpha3":
        capacity: dict[str, Any] = dict(device.capacity)
    else:
        capacity = {name: {"value": q} for name, q in device.capacity}
        for name, policy in device.capacity_policies if device.allow_multiple_allocations else ():
            capacity[name]["requestPolicy"] = _request_policy(policy)
    described: dict[str, Any] = {}
    if attributes:
        described["attributes"] = attributes
    if capacity:
        described["capacity"] = capacity
    if device.taints:
        described["taints"] = [
            {"key": t.key, "value": t.value, "effect": t.effect}
            if t.value
            else {"key": t.key, "effect": t.effect}
            for t in device.taints
        ]
    if device.consumes_counters and partitions:
        described["consumesCounters"] = [_counters(c, "counterSet") for c in device.consumes_counters]
    if device.allow_multiple_allocations and version != "v1alpha3":  # 1.34 on: never in v1alpha3
        described["allowMultipleAllocations"] = True
    if device.binding and bindings and version != "v1alpha3":  # 1.34 on: never in v1alpha3
        described["bindingConditions"] = list(device.binding.conditions)
        described["bindingFailureConditions"] = list(device.binding.failure_conditions)
        if device.binding.binds_to_node:
            described["bindsToNode"] = True
    if version in ("v1beta1", "v1alpha3"):
        return {"name": entry.name, "basic": described}
    return {"name": entry.name, **described}


def _request_policy(policy: CapacityPolicy) -> dict[str, Any]:
    written: dict[str, Any] = {"default": policy.default}
    if policy.valid_values:
        written["validValues"] = list(policy.valid_values)
    if policy.valid_range is not None:
        least, most, step = policy.valid_range
        written["validRange"] = (
            {"min": least} | ({"max": most} if most else {}) | ({"step": step} if step else {})
        )
    return written


def spec_hash(pool: Pool, chunk: Sequence[PoolDevice | CounterSet], generation: int, count: int) -> str:
    """The same for the same content in every version: a slice written in v1beta2 before an API
    server upgrade is still right when read as v1 after it, and is not written again."""
    content = spec(pool, chunk, generation, count, "v1")
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]


def slice_object(
    pool: Pool, chunk: Sequence[PoolDevice | CounterSet], generation: int, count: int, version: str
) -> dict[str, Any]:
    """A new slice (its name generated by the API server), labelled as devshim's."""
    prefix = f"{pool.node}-{pool.driver}"[:200].rstrip(".-") + "-"
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": prefix,
            "labels": {MANAGED_BY: "devshim"},
            "annotations": {SPEC_HASH: spec_hash(pool, chunk, generation, count)},
        },
        "spec": spec(pool, chunk, generation, count, version),
    }


def dropped(sent: dict[str, Any], written: Any, version: str) -> list[str]:
    """The gates (GATED) of the device fields ``sent`` has and the API server's answer
    ``written`` lacks (a slice's counter sets count as its devices' consumption): a feature the
    server has off, or a version without the field."""

    def fields(spec: Any) -> set[str]:
        devices = spec.get("devices") if isinstance(spec, dict) else None
        found = {"consumesCounters"} if isinstance(spec, dict) and spec.get("sharedCounters") else set()
        for device in devices if isinstance(devices, list) else ():
            described = device.get("basic", {}) if version in ("v1beta1", "v1alpha3") else device
            found |= {name for name in GATED if isinstance(described, dict) and described.get(name)}
        return found

    return sorted(GATED[name] for name in fields(sent) - fields(written))

"""A pool of devices as the ResourceSlices that publish it, in each resource.k8s.io version.

Pure: the publisher (shim/dra/publisher.py) decides when to write; this says what. The shapes,
from k8s.io/api's resource/<version>/types.go:

| version | a device's attributes and capacity | spec.nodeName | served by default |
|---|---|---|---|
| v1 | on the device; capacity `{value: q}` | optional | 1.34 on |
| v1beta2 | on the device; capacity `{value: q}` | optional | never (1.33 on, opt-in) |
| v1beta1 | under `basic`; capacity `{value: q}` | a string | never (1.32 on, opt-in) |
| v1alpha3 | under `basic`; capacity a bare quantity | a string | never (1.31-1.33) |
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from shim.dra.names import collisions, device_name
from shim.driverprotocol import MAX_ATTRIBUTES_AND_CAPACITIES
from shim.errors import ShimError
from shim.model import Device

GROUP = "resource.k8s.io"
# Newest first: the publisher takes the first the API server serves.
VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
MAX_DEVICES_PER_SLICE = 128  # ResourceSliceMaxDevices
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


@dataclass(frozen=True, slots=True)
class Pool:
    """One DRA driver's devices on one node, sorted by device name."""

    driver: str
    node: str
    devices: tuple[PoolDevice, ...]

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
    def named(cls, driver: str, node: str, devices: Iterable[PoolDevice]) -> Pool:
        """Devices already named, each name once (shim/dra/ownership.py decided who keeps it)."""
        return cls(driver, node, tuple(sorted(devices, key=_name)))

    def chunks(self) -> list[tuple[PoolDevice, ...]]:
        """The devices of each slice; a pool with no devices is one empty slice (so that a
        scheduler sees the pool, complete and empty)."""
        devices, size = self.devices, MAX_DEVICES_PER_SLICE
        return [devices[i : i + size] for i in range(0, len(devices), size)] or [()]


def _name(device: PoolDevice) -> str:
    return device.name


def spec(
    pool: Pool, chunk: Sequence[PoolDevice], generation: int, count: int, version: str
) -> dict[str, Any]:
    """One slice's spec in ``version``."""
    return {
        "driver": pool.driver,
        "pool": {"name": pool.node, "generation": generation, "resourceSliceCount": count},
        "nodeName": pool.node,
        "devices": [_device(d, version) for d in chunk],
    }


def _device(entry: PoolDevice, version: str) -> dict[str, Any]:
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
    described: dict[str, Any] = {}
    if attributes:
        described["attributes"] = attributes
    if capacity:
        described["capacity"] = capacity
    if version in ("v1beta1", "v1alpha3"):
        return {"name": entry.name, "basic": described}
    return {"name": entry.name, **described}


def spec_hash(pool: Pool, chunk: Sequence[PoolDevice], generation: int, count: int) -> str:
    """The same for the same content in every version: a slice written in v1beta2 before an API
    server upgrade is still right when read as v1 after it, and is not written again."""
    content = spec(pool, chunk, generation, count, "v1")
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]


def slice_object(
    pool: Pool, chunk: Sequence[PoolDevice], generation: int, count: int, version: str
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

"""Schema messages <-> the JSON objects that travel (docs/driver-protocol.md, "Transport").

Incoming params are checked by protobuf's own proto3 JSON parser against the
schema (wrong types, unknown fields, out-of-range numbers, both field-name
forms), then read into the betterproto2 dataclasses a driver works with: one
strict reader instead of a hand-written one that could drift from the schema
(strict.py, imported only when needed: protobuf's runtime is 4 MB of a
driver's memory). Params already in the canonical form devshim writes (proto
field names, every value of exactly its field's JSON type, in range) skip that
parser, whose per-element Python work cost ~350 µs for a preference request of
64 IDs; anything else still goes through it, so it alone decides what is
refused and how, and tests/unit/test_sdk_codec.py checks both readers agree on
generated params.

Outgoing devices and grants are written as dicts straight from the dataclass
fields: betterproto2's generic ``to_dict`` takes 6-25 s for a 50,000-device
list (without / with declared grants), which would eat devshim's 30 s
list_devices budget; this path takes 0.03-0.3 s on the same machine. The
output follows the proto3 JSON mapping as ``to_dict`` does (snake_case names,
fields at their default left out, enums by name); tests/compat/test_sdk_api.py
checks that the two agree, and tests/unit/test_driver_schema.py that every field of
the schema is written. Everything else is small and goes through ``to_dict``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

import betterproto2

from shim.driverprotocol import (
    binding_from_json,
    capacity_policies_from_json,
    counter_sets_from_json,
    taints_from_json,
)
from shim.model import MAX_NUMA_NODE
from shim.sdk.errors import InvalidParams
from shim.sdk.generated.devshim.driver import v1 as types

M = TypeVar("M", bound=betterproto2.Message)

_HEALTH_NAMES = {int(h): h.name for h in types.Health}
_LOG_LEVEL_NAMES = {int(level): level.name for level in types.LogLevel}


def decode(cls: type[M], method: str, params: Any) -> M:
    """``params`` of ``method`` as a ``cls`` message, or InvalidParams (-32602) saying what is wrong."""
    if params is None:  # JSON-RPC lets a request leave params out: all fields at their default
        params = {}
    if not isinstance(params, dict):
        raise InvalidParams(method, f"expected an object, got {type(params).__name__}")
    canonical = read_canonical(cls, params)
    if canonical is not None:
        return canonical
    # Imported here: protobuf's runtime is 4 MB of a driver's memory (docs/benchmarks.md), and
    # devshim only ever sends the canonical form.
    from shim.sdk import strict

    return strict.decode(cls, method, params)


_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "sint32": (-(2**31), 2**31 - 1),
    "sfixed32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "fixed32": (0, 2**32 - 1),
}
_EXACT_TYPES = {"string": str, "bool": bool}


@functools.cache
def _fields(cls: type[betterproto2.Message]) -> dict[str, Any]:
    """The schema's fields of ``cls`` by the name devshim writes (the proto name; betterproto2
    keeps it as the attribute's name), each with its betterproto2 FieldMetadata."""
    every: Any = dataclasses.fields(cls)  # type: ignore[arg-type]  # generated messages are dataclasses
    return {f.name: f.metadata["betterproto"] for f in every if "betterproto" in f.metadata}


def _canonical_value(proto_type: str, value: Any) -> bool:
    """``value`` is exactly the proto3 JSON form devshim writes for a non-message field."""
    exact = _EXACT_TYPES.get(proto_type)
    if exact is not None:
        return type(value) is exact
    limits = _INT_RANGES.get(proto_type)
    return limits is not None and type(value) is int and limits[0] <= value <= limits[1]


def _canonical_list(proto_type: str, values: list[Any]) -> bool:
    exact = _EXACT_TYPES.get(proto_type)
    if exact is not None:
        # Every element's type collected in C: device-ID lists are long (64 IDs: 12 us -> 2 us).
        return set(map(type, values)) <= {exact}
    return all(_canonical_value(proto_type, v) for v in values)


def read_canonical(cls: type[M], params: dict[str, Any]) -> M | None:
    """``params`` as a ``cls`` message when every key is a field's proto name and every value has
    exactly its field's JSON type and range; None for anything else (camelCase names, other
    forms, nulls, maps, enums, oneofs, 64-bit numbers, unknown keys), which protobuf's parser
    then accepts or refuses."""
    fields = _fields(cls)
    messages: Any = cls._betterproto  # type: ignore[arg-type]  # a classproperty on the Message base
    kwargs: dict[str, Any] = {}
    for key, value in params.items():
        meta = fields.get(key)
        if meta is None or meta.map_meta is not None or meta.group is not None:
            return None
        if meta.proto_type == "message":
            items = value if meta.repeated else [value]
            if type(items) is not list or not all(type(v) is dict for v in items):
                return None
            nested = messages.cls_by_field[key]
            read = [read_canonical(nested, v) for v in items]
            if None in read:
                return None
            kwargs[key] = read if meta.repeated else read[0]
        elif meta.repeated:
            if type(value) is not list or not _canonical_list(meta.proto_type, value):
                return None
            kwargs[key] = value
        elif _canonical_value(meta.proto_type, value):
            kwargs[key] = value
        else:
            return None
    return cls(**kwargs)


def message_json(message: betterproto2.Message) -> dict[str, Any]:
    """The generic path, for the small messages."""
    return message.to_dict(casing=betterproto2.Casing.SNAKE)


def _enum_json(value: int, names: dict[int, str]) -> str | int:
    # proto3 JSON writes a value the schema does not name as its number.
    return names.get(int(value), int(value))


def health_json(health: int) -> str | int:
    return _enum_json(health, _HEALTH_NAMES)


def log_level_json(level: int) -> str | int:
    return _enum_json(level, _LOG_LEVEL_NAMES)


# Plain ifs rather than a generic loop over fields, and the dataclasses' own lists and
# maps rather than copies: this runs some 150,000 times for a 50,000-device list with
# declared grants, and the result is serialized at once, before a driver could change them.


def _mount_json(mount: types.Mount) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if mount.container_path:
        out["container_path"] = mount.container_path
    if mount.host_path:
        out["host_path"] = mount.host_path
    if mount.read_only:
        out["read_only"] = True
    return out


def _device_node_json(node: types.DeviceNode) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if node.container_path:
        out["container_path"] = node.container_path
    if node.host_path:
        out["host_path"] = node.host_path
    if node.permissions:
        out["permissions"] = node.permissions
    return out


def _policy_json(policy: types.CapacityPolicy) -> dict[str, Any]:
    out: dict[str, Any] = {"default": policy.default} if policy.default else {}
    if policy.valid_values:
        out["valid_values"] = policy.valid_values
    if policy.valid_range is not None:
        ranged = policy.valid_range
        out["valid_range"] = {
            k: v for k, v in (("min", ranged.min), ("max", ranged.max), ("step", ranged.step)) if v
        }
    return out


def grant_json(grant: types.Grant) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if grant.envs:
        out["envs"] = grant.envs
    if grant.mounts:
        out["mounts"] = [_mount_json(m) for m in grant.mounts]
    if grant.device_nodes:
        out["device_nodes"] = [_device_node_json(n) for n in grant.device_nodes]
    if grant.annotations:
        out["annotations"] = grant.annotations
    if grant.cdi_devices:
        out["cdi_devices"] = grant.cdi_devices
    return out


def device_json(device: types.Device) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if device.id:
        out["id"] = device.id
    if device.health:
        out["health"] = _HEALTH_NAMES.get(device.health, device.health)
    if device.numa_nodes:
        nodes = device.numa_nodes
        # devshim's own bound: a driver learns of a bad ID here, where it is made, rather than from
        # devshim refusing its whole list.
        if not 0 <= min(nodes) <= max(nodes) <= MAX_NUMA_NODE:
            bad = next(n for n in nodes if not 0 <= n <= MAX_NUMA_NODE)
            raise ValueError(
                f"device {device.id!r}: numa_nodes must be integers from 0 to {MAX_NUMA_NODE}, not {bad} "
                "(sysfs's numa_node is -1 for a device without one: leave numa_nodes empty)"
            )
        out["numa_nodes"] = nodes
    # An optional field: present (even as {}) exactly when set.
    if device.grant is not None:
        out["grant"] = grant_json(device.grant)
    if device.attributes:
        out["attributes"] = {name: _attribute_json(a) for name, a in device.attributes.items()}
    if device.capacity:
        out["capacity"] = device.capacity
    if device.taints:
        taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in device.taints]
        try:  # as numa_nodes: the driver learns of a bad taint here, not from a refused list
            taints_from_json(taints)
        except ValueError as exc:
            raise ValueError(f"device {device.id!r}: {exc}") from None
        out["taints"] = taints
    if device.counter_sets or device.consumes_counters:
        sets = [{"name": c.name, "counters": c.counters} for c in device.counter_sets]
        uses = [{"counter_set": c.counter_set, "counters": c.counters} for c in device.consumes_counters]
        try:  # checked where it is made, as taints are
            counter_sets_from_json(sets)
            counter_sets_from_json(uses, "consumes_counters")
        except ValueError as exc:
            raise ValueError(f"device {device.id!r}: {exc}") from None
        if sets:
            out["counter_sets"] = sets
        if uses:
            out["consumes_counters"] = uses
    if device.allow_multiple_allocations:
        out["allow_multiple_allocations"] = True
    if device.capacity_policies:
        policies = {name: _policy_json(p) for name, p in device.capacity_policies.items()}
        try:  # checked where it is made, as taints are
            capacity_policies_from_json(
                policies, tuple(device.capacity.items()), device.allow_multiple_allocations
            )
        except ValueError as exc:
            raise ValueError(f"device {device.id!r}: {exc}") from None
        out["capacity_policies"] = policies
    if device.binding is not None:
        binding: dict[str, Any] = {
            "conditions": device.binding.conditions,
            "failure_conditions": device.binding.failure_conditions,
        }
        if device.binding.binds_to_node:
            binding["binds_to_node"] = True
        try:  # checked where it is made, as taints are
            binding_from_json(binding)
        except ValueError as exc:
            raise ValueError(f"device {device.id!r}: {exc}") from None
        out["binding"] = binding
    return out


def _attribute_json(attribute: types.Attribute) -> dict[str, Any]:
    # The one member of the oneof that is set; an int64 as a string, as proto3 JSON writes it.
    if attribute.int is not None:
        return {"int": str(attribute.int)}
    for kind in ("bool", "string", "version"):
        if (value := getattr(attribute, kind)) is not None:
            return {kind: value}
    raise ValueError("an Attribute needs one of int, bool, string, version set")

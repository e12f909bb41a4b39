"""The driver protocol's JSON <-> the neutral model (docs/driver-protocol.md).

Pure functions, like the kubelet version modules; the host's hot path reads
JSON straight into the model (no intermediate message objects). Every shape
error becomes DriverProtocolError naming what was wrong. Every field of the schema
is read and written, or deliberately not (tests/unit/test_driver_schema.py).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from shim import driverprotocol, revision
from shim.cdi import has_edits
from shim.driverhost.stderr import escaped
from shim.driverprotocol import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_CDI_SPEC_DEVICES,
    MAX_CDI_SPECS,
    PROTOCOL_VERSION,
    attributes_from_json,
    binding_from_json,
    capacity_from_json,
    capacity_policies_from_json,
    conditions_from_json,
    counter_sets_from_json,
    share_json,
    taints_from_json,
)
from shim.errors import RequestError, ShimError, SourceFailed, SourceTimeout, SourceUnavailable
from shim.facts import cdi_device_name_problem, cdi_kind_problem
from shim.jsonrpc import ConnectionClosed, ErrorCode, RemoteError
from shim.model import (
    MAX_NUMA_NODE,
    BindingCondition,
    Capabilities,
    CdiSpec,
    CdiSpecDevice,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    DeviceBinding,
    DeviceNode,
    Health,
    Mount,
    PreferredAllocationRequest,
)


class DriverProtocolError(SourceFailed):
    """The driver answered something the schema does not allow."""


class CapabilityAbsent(SourceFailed):
    """The driver answered -32601: it does not implement an (optional) method after all."""


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    name: str
    capabilities: Capabilities


@dataclass(frozen=True, slots=True)
class Initialized:
    """What a driver's ``initialize`` answered: the resources it declares, the CDI specs it ships."""

    resources: list[ResourceInfo]
    cdi_specs: tuple[CdiSpec, ...]


@functools.cache
def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.title() for part in rest)


def field(obj: Any, snake: str, default: Any = None) -> Any:
    """A field by its proto name or its lowerCamelCase JSON name (both are valid input)."""
    if not isinstance(obj, dict):
        raise DriverProtocolError(f"expected an object, got {type(obj).__name__}")
    if snake in obj:
        return obj[snake]
    # Cached: an optional field left out (numa_nodes, grant) is looked up per device, and
    # building its camelCase name each time was most of reading a 100,000-device list.
    return obj.get(_camel(snake), default)


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    # Element types collected in C: ID lists run to thousands. JSON gives exact str, never a subclass.
    if not isinstance(value, list) or not set(map(type, value)) <= {str}:
        raise DriverProtocolError(f"{what} must be a list of strings")
    return tuple(value)


def _string_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise DriverProtocolError(f"{what} must map strings to strings")
    return value


_HEALTH = {"HEALTHY": Health.HEALTHY, "UNHEALTHY": Health.UNHEALTHY, 1: Health.HEALTHY, 2: Health.UNHEALTHY}


def health_from_json(value: Any) -> Health:
    try:
        return _HEALTH[value]
    except (KeyError, TypeError):
        raise DriverProtocolError(f"health must be HEALTHY or UNHEALTHY, not {value!r}") from None


def grant_from_json(obj: Any) -> ContainerGrant:
    return ContainerGrant(
        envs=_string_map(field(obj, "envs"), "envs"),
        mounts=tuple(
            Mount(
                str(field(m, "container_path", "")),
                str(field(m, "host_path", "")),
                bool(field(m, "read_only")),
            )
            for m in field(obj, "mounts") or ()
        ),
        device_nodes=tuple(
            DeviceNode(
                str(field(n, "container_path", "")),
                str(field(n, "host_path", "")),
                str(field(n, "permissions") or "rw"),
            )
            for n in field(obj, "device_nodes") or ()
        ),
        annotations=_string_map(field(obj, "annotations"), "annotations"),
        cdi_devices=_strings(field(obj, "cdi_devices"), "cdi_devices"),
    )


# A device's fields before protocol 1.1, in both of proto3 JSON's spellings.
_PROTOCOL_1_0 = frozenset({"id", "health", "numa_nodes", "numaNodes", "grant"})


def device_from_json(obj: Any) -> tuple[Device, ContainerGrant | None]:
    device_id = field(obj, "id")
    if not isinstance(device_id, str) or not device_id:
        raise DriverProtocolError(f"a device needs a non-empty string id, got {device_id!r}")
    numa = field(obj, "numa_nodes") or []
    # Exact ints (JSON's true is no node, though Python's True == 1), within the kernel's range.
    if not isinstance(numa, list) or not set(map(type, numa)) <= {int}:
        raise DriverProtocolError(f"device {device_id!r}: numa_nodes must be a list of integers")
    if numa and not 0 <= min(numa) <= max(numa) <= MAX_NUMA_NODE:
        bad = next(n for n in numa if not 0 <= n <= MAX_NUMA_NODE)
        raise DriverProtocolError(
            f"device {device_id!r}: numa_nodes must be integers from 0 to {MAX_NUMA_NODE}, not {bad}"
        )
    grant = field(obj, "grant")
    device = Device(device_id, health_from_json(field(obj, "health")), tuple(numa))
    if obj.keys() <= _PROTOCOL_1_0:  # most lists: one set operation in C, not seven lookups
        return device, grant_from_json(grant) if grant is not None else None
    attributes = field(obj, "attributes")
    capacity = field(obj, "capacity")
    taints = field(obj, "taints")
    sets, uses = field(obj, "counter_sets"), field(obj, "consumes_counters")
    shared, policies = field(obj, "allow_multiple_allocations"), field(obj, "capacity_policies")
    binding = field(obj, "binding")
    if attributes or capacity or taints or sets or uses or shared or policies or binding:  # 1.1-1.4
        if shared is not None and type(shared) is not bool:
            raise DriverProtocolError(
                f"device {device_id!r}: allow_multiple_allocations must be true or false"
            )
        try:
            quantities = capacity_from_json(capacity)
            typed = (
                attributes_from_json(attributes),
                quantities,
                taints_from_json(taints),
                counter_sets_from_json(sets),
                counter_sets_from_json(uses, "consumes_counters"),
                shared is True,
                capacity_policies_from_json(policies, quantities, shared is True),
                binding_from_json(binding),
            )
        except ValueError as exc:
            raise DriverProtocolError(f"device {device_id!r}: {exc}") from None
        device = Device(device.id, device.health, device.numa_nodes, *typed)
        if len(device.attributes) + len(device.capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
            raise DriverProtocolError(
                f"device {device_id!r}: {len(device.attributes) + len(device.capacity)} attributes and "
                f"capacities; DRA allows at most {MAX_ATTRIBUTES_AND_CAPACITIES} together"
            )
    return device, grant_from_json(grant) if grant is not None else None


def devices_from_json(
    result: Any, taken: Sequence[tuple[Device, ContainerGrant | None]] = ()
) -> list[tuple[Device, ContainerGrant | None]]:
    """A list's devices. A device already read is a tuple, which JSON has none of: the driver
    host reads long lists in slices (jsonrpc/sliced.py with ``device_from_json``), and a device
    unchanged since the last list is that list's very object, so every cache downstream, which
    matches devices by identity, skips it. A revision of ``taken`` (the list this resource
    took last, already checked) is checked at its changed positions alone."""
    devices = field(result, "devices") or []
    if not isinstance(devices, list):
        raise DriverProtocolError("devices must be a list")
    changed = revision.changes(devices, taken)
    if (
        changed is not None
        and all(isinstance(devices[i], tuple) for i in changed)
        and all(devices[i][0].id == taken[i][0].id for i in changed)  # the IDs of a checked list
    ):
        return devices
    if all(map(isinstance, devices, itertools.repeat(tuple))):  # in C: no Python per device
        parsed: list[tuple[Device, ContainerGrant | None]] = devices
    else:
        parsed = [d if isinstance(d, tuple) else device_from_json(d) for d in devices]
    if len(set(map(_ID, map(_DEVICE, parsed)))) != len(parsed):
        raise DriverProtocolError("a device ID appears twice in one list")
    return parsed


_DEVICE, _ID = operator.itemgetter(0), operator.attrgetter("id")


def resource_from_json(obj: Any) -> ResourceInfo:
    name = field(obj, "name")
    if not isinstance(name, str) or not name:
        raise DriverProtocolError(f"a resource needs a name, got {name!r}")
    return ResourceInfo(
        name,
        Capabilities(
            preferred_allocation=bool(field(obj, "preferred_allocation")),
            pre_start=bool(field(obj, "prestart")),
            deallocate=bool(field(obj, "deallocate")),
            post_stop=bool(field(obj, "post_stop")),
            admin_access=bool(field(obj, "admin_access")),
            shares=bool(field(obj, "shares")),
            attach=bool(field(obj, "attach")),
        ),
    )


def resources_from_json(obj: Any) -> list[ResourceInfo]:
    resources = field(obj, "resources") or []
    if not isinstance(resources, list):
        raise DriverProtocolError("resources must be a list")
    return [resource_from_json(r) for r in resources]


def check_protocol_version(theirs: Any) -> None:
    """The driver's version, held to driverprotocol's rule."""
    try:
        driverprotocol.check_protocol_version(theirs)
    except driverprotocol.ProtocolVersionRefused as refused:
        raise DriverProtocolError(
            f"the driver's {refused}; devshim speaks {PROTOCOL_VERSION} (majors must match)"
        ) from None


def initialize_params(devshim_version: str, in_use: Iterable[tuple[str, Sequence[str]]]) -> dict[str, Any]:
    """``in_use``: (resource, device IDs) of each group devshim knows to be allocated."""
    return {
        "protocol_version": PROTOCOL_VERSION,
        "devshim_version": devshim_version,
        "allocations": [{"resource": name, "device_ids": list(ids)} for name, ids in in_use],
    }


def initialize_result_from_json(result: Any) -> Initialized:
    """The resources a driver declares and the specs it ships, once its protocol version is
    known to be ours."""
    check_protocol_version(field(result, "protocol_version"))
    return Initialized(resources_from_json(result), cdi_specs_from_json(field(result, "cdi_specs")))


def cdi_specs_from_json(specs: Any) -> tuple[CdiSpec, ...]:
    """Protocol 1.2: the CDI specs a driver ships, each a kind and its devices' edits."""
    if specs is None:
        return ()
    if not isinstance(specs, list) or len(specs) > MAX_CDI_SPECS:
        raise DriverProtocolError(f"cdi_specs must be a list of at most {MAX_CDI_SPECS} specs")
    listed = (field(s, "devices") for s in specs)
    if sum(len(d) for d in listed if isinstance(d, list)) > MAX_CDI_SPEC_DEVICES:  # before reading them
        raise DriverProtocolError(f"cdi_specs: more than {MAX_CDI_SPEC_DEVICES} devices over all specs")
    parsed = tuple(_cdi_spec(s) for s in specs)
    kinds = [s.kind for s in parsed]
    if len(set(kinds)) != len(kinds):
        raise DriverProtocolError("cdi_specs: a kind appears twice (one spec a kind)")
    return parsed


def _cdi_spec(obj: Any) -> CdiSpec:
    kind = field(obj, "kind")
    problem = cdi_kind_problem(kind) if isinstance(kind, str) else f"a kind must be a string, got {kind!r}"
    if problem is not None:
        raise DriverProtocolError(f"cdi_specs: {problem}")
    devices = field(obj, "devices")
    if not isinstance(devices, list) or not 0 < len(devices) <= MAX_CDI_SPEC_DEVICES:
        raise DriverProtocolError(f"cdi_specs[{kind}]: devices must be a list of 1 to {MAX_CDI_SPEC_DEVICES}")
    parsed = tuple(_cdi_spec_device(kind, d) for d in devices)
    if len({d.name for d in parsed}) != len(parsed):
        raise DriverProtocolError(f"cdi_specs[{kind}]: a device name appears twice")
    return CdiSpec(kind, parsed)


def _cdi_spec_device(kind: str, obj: Any) -> CdiSpecDevice:
    name = field(obj, "name")
    problem = (
        cdi_device_name_problem(name) if isinstance(name, str) else f"a name must be a string, got {name!r}"
    )
    if problem is not None:
        raise DriverProtocolError(f"cdi_specs[{kind}]: {problem}")
    written = field(obj, "edits") or {}
    if not isinstance(written, dict):
        raise DriverProtocolError(f"cdi_specs[{kind}] device {name!r}: edits must be an object")
    # A spec has no place for annotations or other CDI names: the schema's CdiEdits has neither.
    edits = grant_from_json({k: v for k, v in written.items() if k not in ("annotations", "cdi_devices")})
    if not has_edits(edits):
        raise DriverProtocolError(
            f"cdi_specs[{kind}] device {name!r}: no edits (CDI refuses a device without any)"
        )
    return CdiSpecDevice(name, edits)


def list_devices_params(resource: str) -> dict[str, Any]:
    return {"resource": resource}


def devices_params(resource: str, device_ids: Sequence[str]) -> dict[str, Any]:
    """The params of prestart, deallocate and post_stop: the devices of one container."""
    return {"resource": resource, "device_ids": list(device_ids)}


def allocate_params(resource: str, requests: Sequence[ContainerAllocateRequest]) -> dict[str, Any]:
    return {"resource": resource, "containers": [_container(r) for r in requests]}


def _container(request: ContainerAllocateRequest) -> dict[str, Any]:
    written: dict[str, Any] = {"device_ids": list(request.device_ids)}
    if request.admin_access:  # protocol 1.3, only ever sent to a resource that declares it
        written["admin_access"] = True
    if request.shares:  # likewise
        written["shares"] = [share_json(s) for s in request.shares]
    return written


def attach_params(resource: str, device_id: str, claim: str, claim_uid: str) -> dict[str, Any]:
    return {"resource": resource, "device_id": device_id, "claim": claim, "claim_uid": claim_uid}


def conditions_from_result(
    result: Any, device_id: str, binding: DeviceBinding
) -> tuple[BindingCondition, ...]:
    try:
        return conditions_from_json(result, binding)
    except ValueError as exc:
        raise DriverProtocolError(f"attach of {device_id!r}: {exc}") from None


def grants_from_json(result: Any, expected: int) -> list[ContainerGrant]:
    containers = field(result, "containers") or []
    if not isinstance(containers, list):
        raise DriverProtocolError("allocate's containers must be a list")
    if len(containers) != expected:  # devshim pairs them with containers by position
        raise DriverProtocolError(f"allocate answered {len(containers)} grants for {expected} containers")
    return [grant_from_json(g) for g in containers]


def preferred_params(resource: str, request: PreferredAllocationRequest) -> dict[str, Any]:
    return {
        "resource": resource,
        "containers": [
            {
                "available": list(request.available),
                "must_include": list(request.must_include),
                "size": request.size,
            }
        ],
    }


def preference_from_json(result: Any) -> tuple[str, ...]:
    containers = field(result, "containers") or []
    if not isinstance(containers, list) or len(containers) != 1:
        raise DriverProtocolError("preferred_allocation must answer one preference per container")
    return _strings(field(containers[0], "device_ids"), "device_ids")


def health_changes_from_json(params: Any) -> dict[str, Health]:
    """A health_changed notification's changes, by device ID."""
    return {str(field(c, "id")): health_from_json(field(c, "health")) for c in field(params, "changes") or ()}


_LOG_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "ERROR"})


def log_from_json(params: Any) -> tuple[str, str]:
    """A log notification's level (INFO for one the schema does not name) and message."""
    level = str(field(params, "level"))
    return level if level in _LOG_LEVELS else "INFO", str(field(params, "message", ""))


def error_for(driver: str, method: str, exc: BaseException) -> ShimError:
    """What a failed driver call means to the kubelet (docs/driver-protocol.md, "Errors")."""
    prefix = f"driver {driver!r}: {method}"
    if isinstance(exc, ShimError):
        return type(exc)(f"{prefix}: {exc}")
    if isinstance(exc, TimeoutError):
        return SourceTimeout(f"{prefix}: {exc or 'no answer in time'}")
    if isinstance(exc, ConnectionClosed):
        return SourceUnavailable(f"{prefix}: the driver is not running ({exc})")
    if isinstance(exc, RemoteError):
        # The driver's own words, logged and sent to the kubelet: escaped as its log lines are.
        said = escaped(str(exc))
        invalid = {ErrorCode.INVALID_PARAMS, ErrorCode.UNKNOWN_DEVICE, ErrorCode.DEVICE_UNHEALTHY}
        if exc.code in invalid | {ErrorCode.UNKNOWN_RESOURCE}:
            return RequestError(f"{prefix}: {said}")
        if exc.code == ErrorCode.UNAVAILABLE:
            return SourceUnavailable(f"{prefix}: {said}")
        if exc.code == ErrorCode.METHOD_NOT_FOUND:
            return CapabilityAbsent(f"{prefix}: {said}")
        return SourceFailed(f"{prefix}: {said}")
    return SourceFailed(f"{prefix}: {type(exc).__name__}: {exc}")

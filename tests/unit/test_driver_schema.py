"""The driver schema's hand-written copies hold every field of proto/driver/v1/driver.proto.

The schema has four representations. Two are generated from it: the protobuf descriptors the SDK's
reader checks params against, and the betterproto2 types (tests/test_generated_fresh.py keeps both
fresh). Two are written by hand, for speed: the SDK's writer (shim/sdk/codec.py, and the results
and notifications built around it) and the driver host's JSON (shim/driverhost/protocol.py).

The descriptor's method table says which messages each side sends. Each message is built from the
descriptor with every field set, to a value of its own, and sent: a driver's by the real SDK, read
by the host's reader; devshim's by the host's writer, read by the SDK. A field that a hand-written
side leaves out fails here until it is added there, or listed below with the reason it is not.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import socket
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import betterproto2
import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from shim.driverhost import protocol
from shim.driverprotocol import PROTOCOL_VERSION
from shim.jsonrpc import MAX_LINE_BYTES, Peer, StreamTransport
from shim.model import (
    MAX_NUMA_NODE,
    ContainerAllocateRequest,
    DeviceBinding,
    DeviceShare,
    PreferredAllocationRequest,
)
from shim.sdk import Driver, codec, serve, types
from shim.sdk.generated.protobuf.driver.v1 import driver_pb2

M = TypeVar("M", bound=betterproto2.Message)
Path = tuple[str | int, ...]  # keys and list indexes into a JSON object

SCHEMA = driver_pb2.DESCRIPTOR
DRIVER_METHODS = SCHEMA.services_by_name["Driver"].methods  # requests devshim sends
NOTIFICATIONS = SCHEMA.services_by_name["Devshim"].methods  # notifications a driver sends
FROM_DRIVER = sorted(
    {m.output_type.name for m in DRIVER_METHODS} | {m.input_type.name for m in NOTIFICATIONS}
)
FROM_DEVSHIM = sorted({m.input_type.name for m in DRIVER_METHODS})

# Fields the host does not read at all, by message and field, with the reason.
HOST_IGNORES = {
    "InitializeResult.driver": "for people: devshim names a driver by its settings, not by what it says",
}
# Fields the host reads but does not keep: their values need not arrive in the model.
HOST_CHECKS = {
    "InitializeResult.protocol_version": "checked against devshim's major (a wrong one is refused)",
}
ATTACHED, FAILED = "example.com/attached", "example.com/attach-failed"
# Values the host would refuse: these fields get one it accepts.
ACCEPTED = {
    "InitializeResult.protocol_version": PROTOCOL_VERSION,
    "Attribute.version": "1.2.3-rc.1",
    "CdiSpec.kind": "example.com/fpga",  # CDI's name rules
    "CdiSpecDevice.name": "fpga-0",
    "DeviceTaint.key": "gpu.example.com/going-away",  # a label name
    "DeviceTaint.value": "firmware",  # a label value
    "DeviceTaint.effect": "NoExecute",
    "CounterSet.name": "gpu-0",  # a DNS label
    "CounterConsumption.counter_set": "gpu-0",
    "DeviceBinding.conditions": ATTACHED,  # condition types: label names
    "DeviceBinding.failure_conditions": FAILED,
    "BindingCondition.type": ATTACHED,  # one the device declares
    "BindingCondition.reason": "Attached",  # CamelCase
}
# Maps whose keys and values the host checks: these get entries it accepts.
ACCEPTED_MAPS = {
    "Device.capacity": {"memory": "80Gi", "cores": "1500m"},
    "CounterSet.counters": {"memory": "80Gi", "slices": "7"},  # DNS labels to quantities
    "CounterConsumption.counters": {"memory": "40Gi"},
    # Capacities the device has; valid values or a range, one a policy (protocol 1.4).
    "Device.capacity_policies": {
        "memory": {"default": "8Gi", "valid_values": ["8Gi", "16Gi"]},
        "cores": {"default": "1", "valid_range": {"min": "0", "max": "1", "step": "1"}},
    },
}


# --- every field set, from the descriptor ------------------------------------------------------


def _key(f: FieldDescriptor) -> str:
    return f.full_name.removeprefix(f"{SCHEMA.package}.")  # "Grant.envs"


def _is_map(f: FieldDescriptor) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


def full(descriptor: Descriptor) -> dict[str, Any]:
    """Every field of the message set, in the proto3 JSON form, each to a value of its own."""
    return {f.name: _value(f) for f in descriptor.fields}


def _held(f: FieldDescriptor) -> Descriptor | None:
    """The message type a map holds as values, or None for a map of scalars."""
    assert f.message_type is not None
    held: Descriptor | None = f.message_type.fields_by_name["value"].message_type
    return held


def _value(f: FieldDescriptor) -> Any:
    key = _key(f)
    if _is_map(f):
        held = _held(f)
        if (
            held is not None and key not in ACCEPTED_MAPS
        ):  # one entry per field, each of its own (a oneof holds one at a time)
            return {f"{m.name}_entry": {m.name: _value(m)} for m in held.fields}
        return ACCEPTED_MAPS.get(key, {f"{key}.key": f"{key}.value"})
    one: Any
    if f.message_type is not None:
        one = full(f.message_type)
    elif f.enum_type is not None:
        one = f.enum_type.values[-1].name  # the last: never the default, 0
    elif f.type == FieldDescriptor.TYPE_BOOL:
        one = True
    elif f.type == FieldDescriptor.TYPE_STRING:
        one = ACCEPTED.get(key, key)
    elif f.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64):
        one = zlib.crc32(key.encode()) % MAX_NUMA_NODE + 1  # its own, and a NUMA node ID
    else:
        raise AssertionError(f"{key}: a field type this test cannot fill yet; teach _value its values")
    return [one] if f.is_repeated else one


def _checked(name: str) -> Any:
    return json_format.ParseDict(full(SCHEMA.message_types_by_name[name]), getattr(driver_pb2, name)())


def canonical(name: str) -> dict[str, Any]:
    """The full message ``name`` as protobuf writes it: the schema's own word on what travels."""
    return json_format.MessageToDict(_checked(name), preserving_proto_field_name=True)


def message(cls: type[M]) -> M:
    """The full message as the betterproto2 type a driver works with."""
    return cls.parse(_checked(cls.__name__).SerializeToString())


def fields(
    descriptor: Descriptor, value: dict[str, Any], at: Path = ()
) -> Iterator[tuple[Path, FieldDescriptor]]:
    """Every field set in ``value`` and in its nested messages (not in those the host ignores)."""
    for f in descriptor.fields:
        if f.name not in value:
            continue
        here = (*at, f.name)
        yield here, f
        if f.message_type is None or _key(f) in HOST_IGNORES:
            continue
        if _is_map(f):
            held = _held(f)
            if held is not None:
                for entry, item in value[f.name].items():
                    yield from fields(held, item, (*here, entry))
            continue
        items = enumerate(value[f.name]) if f.is_repeated else [(None, value[f.name])]
        for i, item in items:
            yield from fields(f.message_type, item, here if i is None else (*here, i))


def missing(descriptor: Descriptor, value: dict[str, Any], at: str = "") -> list[str]:
    """The fields of ``descriptor`` that ``value`` (every field set) leaves out, nested ones too."""
    out = []
    for f in descriptor.fields:
        where = f"{at}{descriptor.name}.{f.name}"
        if f.name not in value:
            out.append(where)
        elif f.message_type is not None and not _is_map(f):
            items = value[f.name] if f.is_repeated else [value[f.name]]
            for item in items:
                out += missing(f.message_type, item, f"{where} > ")
    return out


def _at(value: Any, path: Path) -> Any:
    for step in path:
        value = value[step]
    return value


def _without(value: dict[str, Any], path: Path) -> dict[str, Any]:
    value = copy.deepcopy(value)
    del _at(value, path[:-1])[path[-1]]
    return value


def _plain(f: FieldDescriptor) -> bool:
    """Strings and numbers, and maps of them: the model keeps their values as they are, and each
    is unique here (an enum becomes the model's own, Health.UNHEALTHY is "Unhealthy"; bools are
    all true: those are told apart by leaving them out)."""
    return f.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_INT32) or _is_map(f)


def _scalars(value: Any) -> set[Any]:
    if isinstance(value, dict):  # a map's keys, and its values unless messages (checked as fields)
        return {*value, *(v for v in value.values() if not isinstance(v, dict))}
    return set(value) if isinstance(value, list) else {value}


def _leaves(obj: object) -> Iterator[object]:
    """Every scalar in a model value: dataclass fields, items, keys and values, nested."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name))
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _leaves(key)
            yield from _leaves(value)
    elif isinstance(obj, tuple | list):
        for item in obj:
            yield from _leaves(item)
    else:
        yield obj


# --- a driver on the SDK that sends every message full ------------------------------------------

INIT = message(types.InitializeResult)
INFO = message(types.DriverInfo)
RESOURCE = INIT.resources[0].name


class Full(Driver):
    """Every answer and notification is the full message of its type."""

    name = INFO.name
    version = INFO.version

    def resources(self) -> list[types.Resource]:
        return list(INIT.resources)

    def cdi_specs(self) -> list[types.CdiSpec]:
        return list(INIT.cdi_specs)

    async def list_devices(self, resource: str) -> list[types.Device]:
        return list(message(types.ListDevicesResult).devices)

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return list(message(types.AllocateResult).containers)

    async def preferred_allocation(self, resource: str, request: types.PreferenceRequest) -> list[str]:
        return list(message(types.PreferredAllocationResult).containers[0].device_ids)

    async def prestart(self, resource: str, device_ids: list[str]) -> None:
        pass

    async def attach(
        self, resource: str, device_id: str, claim: str, claim_uid: str
    ) -> list[types.BindingCondition]:
        return list(message(types.AttachResult).conditions)


@dataclass
class Devshim:
    """devshim's side of the pipe, played by a plain Peer: what the driver answered or sent."""

    driver: Full
    peer: Peer
    notified: asyncio.Queue[tuple[str, Any]]

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        return await self.peer.request(method, params, timeout=10)

    async def notification(self, method: str, send: Awaitable[None]) -> Any:
        await send
        async with asyncio.timeout(10):
            got, params = await self.notified.get()
        assert got == method
        return params


@asynccontextmanager
async def served() -> AsyncIterator[Devshim]:
    async def transport(sock: socket.socket) -> StreamTransport:
        return StreamTransport(*await asyncio.open_connection(sock=sock, limit=MAX_LINE_BYTES))

    def collect(method: str) -> Callable[[Any], None]:
        return lambda params: notified.put_nowait((method, params))

    ours, theirs = socket.socketpair()
    notified: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    handlers = {m.name: collect(m.name) for m in NOTIFICATIONS}
    peer = Peer(await transport(ours), name="devshim", notifications=handlers)
    driver = Full()
    reading = asyncio.create_task(peer.run())
    serving = asyncio.create_task(serve(driver, await transport(theirs)))
    try:
        # Answered once serve() has attached the driver: it may send notifications from then on.
        await peer.request("initialize", {"protocol_version": PROTOCOL_VERSION}, timeout=10)
        yield Devshim(driver, peer, notified)
    finally:
        await peer.close()
        async with asyncio.timeout(10):
            await serving
        reading.cancel()
        await asyncio.wait([reading])


# How the SDK is made to send each message: a request answered, or a notification sent.
SDK_SENDS: dict[str, Callable[[Devshim], Awaitable[Any]]] = {
    "InitializeResult": lambda d: d.call("initialize", {"protocol_version": PROTOCOL_VERSION}),
    "ListDevicesResult": lambda d: d.call("list_devices", {"resource": RESOURCE}),
    "AllocateResult": lambda d: d.call(
        "allocate", {"resource": RESOURCE, "containers": [{"device_ids": ["d0"]}]}
    ),
    "PreferredAllocationResult": lambda d: d.call(
        "preferred_allocation", {"resource": RESOURCE, "containers": [{"available": ["d0"], "size": 1}]}
    ),
    "Empty": lambda d: d.call("prestart", {"resource": RESOURCE, "device_ids": ["d0"]}),
    "AttachResult": lambda d: d.call(
        "attach", {"resource": RESOURCE, "device_id": "d0", "claim": "default/c", "claim_uid": "u-1"}
    ),
    "DevicesChangedParams": lambda d: d.notification(
        "devices_changed", d.driver.devices_changed(*_devices_changed())
    ),
    "HealthChangedParams": lambda d: d.notification(
        "health_changed", d.driver.health_changed(*_health_changed())
    ),
    "ResourcesChangedParams": lambda d: d.notification("resources_changed", d.driver.resources_changed()),
    "LogParams": lambda d: d.notification("log", d.driver.log(*_log())),
}


def _devices_changed() -> tuple[str, list[types.Device]]:
    changed = message(types.DevicesChangedParams)
    return changed.resource, changed.devices


def _health_changed() -> tuple[str, list[tuple[str, types.Health]]]:
    changed = message(types.HealthChangedParams)
    return changed.resource, [(c.id, c.health) for c in changed.changes]


def _log() -> tuple[types.LogLevel, str]:
    log = message(types.LogParams)
    return log.level, log.message


# How the host reads each message a driver sends (notifications: the resource first, as
# DriverHost._notified_source does, then the rest).
HOST_READS: dict[str, Callable[[Any], object]] = {
    "InitializeResult": protocol.initialize_result_from_json,
    "ListDevicesResult": protocol.devices_from_json,
    "AllocateResult": lambda result: protocol.grants_from_json(result, 1),
    "PreferredAllocationResult": protocol.preference_from_json,
    "Empty": lambda result: None,
    "AttachResult": lambda result: protocol.conditions_from_result(
        result, "d0", DeviceBinding((ATTACHED,), (FAILED,))
    ),
    "DevicesChangedParams": lambda p: (protocol.field(p, "resource"), protocol.devices_from_json(p)),
    "HealthChangedParams": lambda p: (protocol.field(p, "resource"), protocol.health_changes_from_json(p)),
    "ResourcesChangedParams": protocol.resources_from_json,
    "LogParams": protocol.log_from_json,
}

# What the host's writer sends for each request, from model values that fill every field.
HOST_WRITES: dict[str, Callable[[], dict[str, Any]]] = {
    "InitializeParams": lambda: protocol.initialize_params("0.1.0", [("example.com/a", ("a0",))]),
    "ListDevicesParams": lambda: protocol.list_devices_params("example.com/a"),
    # Every field: the admin-access flag is written only where set (proto3's default left out).
    "AllocateParams": lambda: protocol.allocate_params(
        "example.com/a",
        [
            ContainerAllocateRequest(
                ("a0",), admin_access=True, shares=(DeviceShare("a0", "s-1", (("memory", "8Gi"),)),)
            )
        ],
    ),
    "PreferredAllocationParams": lambda: protocol.preferred_params(
        "example.com/a", PreferredAllocationRequest(("a0", "a1"), ("a0",), 1)
    ),
    "DevicesParams": lambda: protocol.devices_params("example.com/a", ["a0"]),
    "AttachParams": lambda: protocol.attach_params("example.com/a", "a0", "default/c", "u-1"),
    "ShutdownParams": dict,  # DriverProcess.stop sends it as it is: no fields
}


def _read(name: str, value: dict[str, Any]) -> tuple[str, object]:
    try:
        return "read", HOST_READS[name](value)
    except protocol.DriverProtocolError as exc:
        return "refused", str(exc)


# --- the tests ------------------------------------------------------------------------------------


def test_every_message_travels_and_each_side_has_its_code_for_it() -> None:
    """A message the method table does not reach, or one new to it, fails until it is placed."""
    reached: set[str] = set()
    todo = [SCHEMA.message_types_by_name[n] for n in FROM_DRIVER + FROM_DEVSHIM]
    while todo:
        descriptor = todo.pop()
        if descriptor.name not in reached:
            if not descriptor.GetOptions().map_entry:  # an entry is not a message of the schema's
                reached.add(descriptor.name)
            todo += [f.message_type for f in descriptor.fields if f.message_type is not None]
    assert reached == set(SCHEMA.message_types_by_name)
    assert set(SDK_SENDS) == set(HOST_READS) == set(FROM_DRIVER)
    assert set(HOST_WRITES) == set(FROM_DEVSHIM)


@pytest.mark.parametrize("name", FROM_DRIVER)
async def test_the_sdk_writes_every_field_a_driver_sends(name: str) -> None:
    """Device, Grant, Mount, DeviceNode, Resource, ...: codec.py's fast path and the dicts the SDK
    builds around it write every field, as protobuf writes it."""
    async with served() as devshim:
        sent = await SDK_SENDS[name](devshim)
    assert missing(SCHEMA.message_types_by_name[name], sent) == []
    assert sent == canonical(name)


@pytest.mark.parametrize("name", FROM_DRIVER)
def test_the_host_reads_every_field_a_driver_sends(name: str) -> None:
    """Left out, every field changes what the host reads; every string and number set arrives in
    the model objects (enums and bools are told apart by leaving them out)."""
    descriptor = SCHEMA.message_types_by_name[name]
    sent = canonical(name)
    whole = _read(name, sent)
    assert whole[0] == "read", whole
    kept = set(_leaves(whole[1]))
    for path, f in fields(descriptor, sent):
        key = _key(f)
        if key in HOST_IGNORES:
            continue
        assert _read(name, _without(sent, path)) != whole, f"the host ignores {key} (at {path})"
        if _plain(f) and key not in HOST_CHECKS:
            assert _scalars(_at(sent, path)) <= kept, f"the host drops the value of {key} (at {path})"


@pytest.mark.parametrize("name", FROM_DEVSHIM)
def test_the_host_writes_every_field_devshim_sends(name: str) -> None:
    """And the SDK's reader, protobuf's parser on the same descriptor, takes it."""
    params = HOST_WRITES[name]()
    assert missing(SCHEMA.message_types_by_name[name], params) == []
    cls = getattr(types, name)
    checked = json_format.ParseDict(params, getattr(driver_pb2, name)())
    assert codec.decode(cls, name, params) == cls.parse(checked.SerializeToString())

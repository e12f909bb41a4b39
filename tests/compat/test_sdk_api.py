"""The driver SDK's API in process: a Driver subclass served over a socketpair, devshim's side
played by a plain JSON-RPC Peer, and the fast device encoding against betterproto2's own."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import betterproto2
import pytest
from google.protobuf import json_format

from shim.driverprotocol import PROTOCOL_VERSION
from shim.jsonrpc import MAX_LINE_BYTES, ConnectionClosed, Peer, RemoteError, StreamTransport
from shim.sdk import Driver, DriverError, ErrorCode, UnknownDevice, codec, serve, strict, types
from shim.sdk.codec import device_json
from shim.sdk.generated.protobuf.driver.v1 import driver_pb2

TOY = "example.com/toy"


class Toy(Driver):
    """Declares prestart but leaves it alone; allocate knows one device."""

    name = "toy"
    version = "9.9.9"

    def __init__(self) -> None:
        self.initialized_with: types.InitializeParams | None = None
        self.shutdowns = 0

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=TOY, prestart=True)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id="t0", health=types.Health.HEALTHY)]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        if containers == [["busy"]]:
            raise DriverError(ErrorCode.UNAVAILABLE, "busy")
        for device_id in (i for ids in containers for i in ids if i != "t0"):
            raise UnknownDevice(resource, device_id)
        return [types.Grant(envs={"T": ",".join(ids)}) for ids in containers]

    async def on_initialize(self, params: types.InitializeParams) -> None:
        self.initialized_with = params

    async def on_shutdown(self) -> None:
        self.shutdowns += 1


NOTIFICATIONS = ("devices_changed", "health_changed", "resources_changed", "log")


@dataclass
class Devshim:
    peer: Peer
    notifications: asyncio.Queue[tuple[str, Any]]

    async def call(self, method: str, params: Any) -> Any:
        return await self.peer.request(method, params, timeout=10)


async def transport(sock: socket.socket) -> StreamTransport:
    return StreamTransport(*await asyncio.open_connection(sock=sock, limit=MAX_LINE_BYTES))


@asynccontextmanager
async def connected(driver: Driver) -> AsyncIterator[Devshim]:
    """``driver`` served by serve() over a socketpair; devshim's side is a Peer collecting notifications."""
    ours, theirs = socket.socketpair()
    notifications: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def collect(method: str) -> Callable[[Any], None]:
        return lambda params: notifications.put_nowait((method, params))

    peer = Peer(await transport(ours), name="devshim", notifications={m: collect(m) for m in NOTIFICATIONS})
    reading = asyncio.create_task(peer.run())
    serving = asyncio.create_task(serve(driver, await transport(theirs)))
    try:
        yield Devshim(peer, notifications)
    finally:
        await peer.close()
        async with asyncio.timeout(10):
            await serving
        reading.cancel()
        await asyncio.wait([reading])


async def test_initialize_reports_the_driver_and_hands_allocations_to_on_initialize() -> None:
    """The answer carries the SDK's protocol version, the class's name and version and its
    resources; on_initialize sees devshim's allocations to rebuild state from."""
    driver = Toy()
    async with connected(driver) as devshim:
        result = await devshim.call(
            "initialize",
            {"protocol_version": "1.0.0", "allocations": [{"resource": TOY, "device_ids": ["t0"]}]},
        )
    assert result == {
        "protocol_version": PROTOCOL_VERSION,  # a devshim speaking 1.0 accepts a 1.1 driver
        "driver": {"name": "toy", "version": "9.9.9"},
        "resources": [{"name": TOY, "prestart": True}],
    }
    assert driver.initialized_with is not None
    assert [list(a.device_ids) for a in driver.initialized_with.allocations] == [["t0"]]


async def test_an_optional_method_left_alone_is_method_not_found_even_when_declared() -> None:
    """A resource that declares prestart while the class does not implement it answers -32601
    with the documented message, which devshim reads as "capability absent"."""
    async with connected(Toy()) as devshim:
        with pytest.raises(RemoteError) as caught:
            await devshim.call("prestart", {"resource": TOY, "device_ids": ["t0"]})
    assert (caught.value.code, caught.value.message) == (-32601, f"{TOY} does not implement prestart")


async def test_an_undeclared_optional_method_is_method_not_found() -> None:
    """An optional method the resource does not declare is -32601 before the driver is called."""
    async with connected(Toy()) as devshim:
        with pytest.raises(RemoteError) as caught:
            await devshim.call("deallocate", {"resource": TOY, "device_ids": ["t0"]})
    assert (caught.value.code, caught.value.message) == (-32601, f"{TOY} does not implement deallocate")


@pytest.mark.parametrize(
    ("ids", "code", "message"),
    [
        (["t0", "t9"], -32001, f"{TOY}: unknown device 't9'"),
        (["busy"], -32004, "busy"),
    ],
    ids=["unknown-device", "driver-error"],
)
async def test_driver_errors_become_error_objects(ids: list[str], code: int, message: str) -> None:
    """UnknownDevice and DriverError reach devshim as their code and message. (An answer that does
    not pair one grant with each container is refused on devshim's side of the pipe, once:
    tests/unit/test_driver_protocol.py.)"""
    async with connected(Toy()) as devshim:
        with pytest.raises(RemoteError) as caught:
            await devshim.call("allocate", {"resource": TOY, "containers": [{"device_ids": ids}]})
    assert (caught.value.code, caught.value.message) == (code, message)


async def test_notifications_go_out_in_the_schema_snake_case_form() -> None:
    """devices_changed, health_changed, resources_changed (the full current resources) and log
    are sent with snake_case names, enums by name and defaults left out."""
    driver = Toy()
    async with connected(driver) as devshim:
        await devshim.call("initialize", {"protocol_version": "1.0.0"})
        await driver.devices_changed(TOY, [types.Device(id="t0", numa_nodes=[1])])
        await driver.health_changed(TOY, [("t0", types.Health.UNHEALTHY)])
        await driver.resources_changed()
        await driver.log("warning", "hot")
        received: list[tuple[str, Any]] = []
        for _ in range(4):
            async with asyncio.timeout(10):
                received.append(await devshim.notifications.get())
    assert received == [
        ("devices_changed", {"resource": TOY, "devices": [{"id": "t0", "numa_nodes": [1]}]}),
        ("health_changed", {"resource": TOY, "changes": [{"id": "t0", "health": "UNHEALTHY"}]}),
        ("resources_changed", {"resources": [{"name": TOY, "prestart": True}]}),
        ("log", {"level": "WARNING", "message": "hot"}),
    ]


async def test_notifying_while_not_served_raises_connection_closed() -> None:
    """A notification before serve() or after it ended fails loudly instead of vanishing."""
    with pytest.raises(ConnectionClosed):
        await Toy().log("INFO", "nobody listens")


async def test_a_request_read_before_the_stream_ends_is_still_answered() -> None:
    """devshim sends shutdown and closes the pipe at once: the driver still answers, runs
    on_shutdown exactly once, and serve() returns."""
    driver = Toy()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    loop = asyncio.get_running_loop()
    serving = asyncio.create_task(serve(driver, await transport(theirs)))
    await loop.sock_sendall(ours, b'{"jsonrpc":"2.0","id":7,"method":"shutdown","params":{}}\n')
    ours.shutdown(socket.SHUT_WR)
    async with asyncio.timeout(10):
        answer = await loop.sock_recv(ours, 4096)
    assert answer == b'{"jsonrpc":"2.0","id":7,"result":{}}\n'
    async with asyncio.timeout(10):
        await serving
    assert driver.shutdowns == 1
    ours.close()


def _devices() -> list[types.Device]:
    full = types.Grant(
        envs={"A": "1", "B": ""},
        mounts=[types.Mount(container_path="/c", host_path="/h", read_only=True), types.Mount()],
        device_nodes=[types.DeviceNode(container_path="/dev/x", host_path="/dev/x", permissions="rw")],
        annotations={"k": "v"},
        cdi_devices=["vendor.example/gpu=0"],
    )
    return [
        types.Device(),
        types.Device(id="a"),
        types.Device(id="b", health=types.Health.UNHEALTHY, numa_nodes=[0, 1]),
        types.Device(id="c", health=types.Health.HEALTHY, grant=types.Grant()),
        types.Device(id="d", health=types.Health.HEALTHY, numa_nodes=[0], grant=full),
    ]


@pytest.mark.parametrize(
    "device", _devices(), ids=["empty", "id-only", "unhealthy", "empty-grant", "full-grant"]
)
def test_the_fast_device_encoding_equals_betterproto2s(device: types.Device) -> None:
    """device_json writes exactly what betterproto2's to_dict writes (snake_case, defaults left
    out, an optional grant present even when empty), only faster."""
    assert device_json(device) == device.to_dict(casing=betterproto2.Casing.SNAKE)


ALLOCATIONS = [{"resource": "example.com/a", "device_ids": ["a0", "a1"]}, {}]
SIXTY_FOUR = [f"d{i}" for i in range(64)]


@pytest.mark.parametrize(
    ("name", "params"),
    [
        (
            "InitializeParams",
            {"protocol_version": "1.0.0", "devshim_version": "0.1", "allocations": ALLOCATIONS},
        ),
        ("ListDevicesParams", {"resource": "example.com/a"}),
        ("AllocateParams", {"resource": "r", "containers": [{"device_ids": ["a0"]}, {"deviceIds": []}]}),
        (
            "PreferredAllocationParams",
            {
                "resource": "r",
                "containers": [{"available": SIXTY_FOUR, "must_include": ["d9"], "size": 8}, {}],
            },
        ),
        ("DevicesParams", {"resource": "example.com/a", "device_ids": ["a0"]}),
        ("ShutdownParams", {}),
    ],
)
def test_decoded_params_equal_betterproto2s_own_parse(name: str, params: dict[str, Any]) -> None:
    """Both readers build the dataclasses themselves instead of re-parsing bytes (codec.py reads
    devshim's canonical form, strict.py copies protobuf's checked fields by descriptor): each must
    give exactly what betterproto2 parses from the same checked message, for every request."""
    checked = json_format.ParseDict(params, getattr(driver_pb2, name)())
    cls = getattr(types, name)
    parsed = cls.parse(checked.SerializeToString())
    assert codec.read_canonical(cls, params) in (None, parsed)  # None: a form left to strict.py
    assert codec.decode(cls, "m", params) == strict.decode(cls, "m", params) == parsed

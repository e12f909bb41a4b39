"""Malformed kubelet requests against a real devshim, on both API versions.

One devshim per module serves a static resource and a resource of the simulated driver (a real
subprocess), each on its own unix socket hosting v1beta1 and v1beta2. Hypothesis sends every
DevicePlugin RPC requests built as messages (empty, unknown and unhealthy IDs, duplicates, 10,000
IDs, very long and non-ASCII IDs, any allocation size) and as raw bytes (random, truncated,
unknown fields, wrong wire types, invalid UTF-8, sizes around the 4 MiB limit), through a raw
grpc.aio channel with the kubelet's default 4 MiB receive limit.

What must hold: devshim's handlers answer OK or INVALID_ARGUMENT, never INTERNAL or UNKNOWN, and
as the core's rules predict; a refused request changes nothing (the device list, its health, the
allocations devshim tracks); no ListAndWatch stream sees a new list. Requests grpcio refuses
before any handler runs are asserted as what they are: bytes that do not parse as the method's
message answer UNKNOWN ("Unexpected <class '...DecodeError'>"), and a message over 4 MiB
RESOURCE_EXHAUSTED ("Received message larger than max").
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf.message import DecodeError, Message
from hypothesis import currently_in_test_context, event, example, given
from hypothesis import strategies as st

from shim.bootstrap import Shim
from shim.deviceplugin.common import KUBELET_MAX_MESSAGE_BYTES
from shim.deviceplugin.encoded import _varint
from shim.generated.v1beta1 import api_pb2 as v1beta1
from shim.generated.v1beta2 import api_pb2 as v1beta2
from shim.model import Device
from shim.settings import Settings
from tests.fuzz.profiles import examples

pytestmark = pytest.mark.asyncio(loop_scope="module")

STATIC = "example.com/fuzz"
DRIVEN = "example.com/fuzzsim"
RESOURCES = (STATIC, DRIVEN)
VERSIONS: dict[str, ModuleType] = {"v1beta1": v1beta1, "v1beta2": v1beta2}
HEALTHY = {STATIC: ("dev0", "dev1", "dev2"), DRIVEN: ("sim-a", "sim-b", "sim-c")}
UNHEALTHY = {STATIC: "sick", DRIVEN: "sim-sick"}
KNOWN = {r: (*HEALTHY[r], UNHEALTHY[r]) for r in RESOURCES}
CALL_TIMEOUT_S = 30.0
# Codes devshim's handlers may answer malformed input with; INTERNAL and UNKNOWN mean a bug.
HANDLER_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}
# grpc.aio's answer when the request deserializer raises (before any handler runs).
UNPARSABLE = "Unexpected <class 'google.protobuf.message.DecodeError'>"

STATIC_GRANT = {
    "envs": {"FUZZ_DEVICES": "{ids}"},
    "device_nodes": [{"container_path": "/dev/fuzz-{id}", "host_path": "/dev/null", "permissions": "rw"}],
    "cdi_devices": ["example.com/fuzz={id}"],
}
SIM_CONFIG = {
    "resources": [
        {
            "name": DRIVEN,
            "devices": [
                {"id": "sim-a", "numa_nodes": [0]},
                {"id": "sim-b", "numa_nodes": [0]},
                {"id": "sim-c", "numa_nodes": [1]},
                {"id": "sim-sick", "healthy": False},
            ],
            "grant_mode": "per_call",
            "grant": {"envs": {"SIM_DEVICES": "{ids}"}, "cdi_devices": ["example.com/sim={id}"]},
            "preferred_allocation": True,
            "prestart": True,
            "deallocate": True,
            "post_stop": True,
        }
    ]
}


# --- devshim, once per module ------------------------------------------------------------------


@dataclass
class Watch:
    """One ListAndWatch stream, held open for the whole module: every list it received."""

    lists: list[tuple[tuple[str, str], ...]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


@dataclass
class Served:
    shim: Shim
    channels: dict[str, grpc.aio.Channel]
    watches: dict[tuple[str, str], Watch]

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # How hypothesis prints this fixture beside a failing example: briefly, not field by field.
        printer.text("<devshim under test>")

    def state(self) -> dict[str, Any]:
        """Everything a request could change: the device lists (with health) and the allocations
        devshim tracks (the deallocation emulator's groups, the driver source's in-use set)."""
        driver = self.shim.drivers[0].sources[DRIVEN]
        return {
            "devices": {r: self.shim.services[r].devices for r in RESOURCES},
            "held": {r: self.shim.deallocation.tracker.held(r) for r in RESOURCES},
            "in_use": driver.in_use,
        }

    def devices(self) -> dict[str, tuple[Device, ...]]:
        return {r: self.shim.services[r].devices for r in RESOURCES}

    async def call(
        self, resource: str, version: str, method: str, request: bytes
    ) -> tuple[grpc.StatusCode, bytes, str]:
        """One unary call with raw bytes: the code, the response bytes (OK) and the details."""
        rpc = self.channels[resource].unary_unary(f"/{version}.DevicePlugin/{method}", None, None)
        try:
            response = await rpc(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            return error.code(), b"", error.details() or ""
        return grpc.StatusCode.OK, response, ""

    def assert_no_new_list(self) -> None:
        """Each stream still holds exactly the list it opened with: nothing changed a device."""
        for key, watch in self.watches.items():
            assert len(watch.lists) == 1, (key, watch.lists[1:])


def settings_for(plugin_dir: Path, state_dir: Path) -> Settings:
    return Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        api_versions=["v1beta1", "v1beta2"],
        register_backoff_max_s=5,
        # No kubelet here: the emulator would poll a PodResources socket that does not exist.
        deallocation={"pod_resources_socket": str(state_dir / "no-pod-resources.sock")},
        resources=[
            {
                "name": STATIC,
                "static": {
                    "devices": [
                        {"id": "dev0", "numa_nodes": [0]},
                        {"id": "dev1", "numa_nodes": [0]},
                        {"id": "dev2", "numa_nodes": [1]},
                        {"id": "sick", "healthy": False},
                    ],
                    "grant": STATIC_GRANT,
                    "pre_start": True,
                },
            }
        ],
        drivers=[
            {
                "name": "sim",
                "user": "root",
                "command": [
                    sys.executable,
                    "-m",
                    "devshim_adapters.sim",
                    "--config-json",
                    json.dumps(SIM_CONFIG),
                ],
                # Exactly what SIM_CONFIG's grant holds.
                "resources": [DRIVEN],
                "policy": {"envs": ["SIM_DEVICES"], "cdi_kinds": ["example.com/sim"]},
            }
        ],
    )


async def _follow(channel: grpc.aio.Channel, version: str, watch: Watch) -> None:
    # The endpoint's task may not have bound its socket yet: wait for it as a kubelet's retry would.
    listing = channel.unary_stream(f"/{version}.DevicePlugin/ListAndWatch", None, None)
    stream = listing(b"", wait_for_ready=True)
    async for raw in stream:
        message: Any = VERSIONS[version].ListAndWatchResponse.FromString(raw)
        watch.lists.append(tuple((d.ID, d.health) for d in message.devices))


def _listed(watch: Watch) -> bool:
    """Whether the stream has its first list; a stream that failed says why at once."""
    if not watch.lists and watch.task is not None and watch.task.done():
        raise AssertionError(f"the stream ended before its first list: {watch.task.exception()!r}")
    return bool(watch.lists)


async def _until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)
    assert condition(), what


@pytest.fixture(scope="module")
def dirs() -> Iterator[tuple[Path, Path]]:
    """Short paths of its own (unix sockets): the shared plugin_dir fixture is per test."""
    with (
        tempfile.TemporaryDirectory(prefix="ds-", dir="/tmp") as plugins,
        tempfile.TemporaryDirectory(prefix="ds-state-", dir="/tmp") as state,
    ):
        yield Path(plugins), Path(state)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(dirs: tuple[Path, Path]) -> AsyncIterator[Served]:
    """devshim serving both resources on both versions, with a ListAndWatch stream held on each
    version of each resource (no kubelet: the endpoints serve and wait to register)."""
    async with Shim(settings_for(*dirs)) as shim:
        await _until(lambda: DRIVEN in shim.served, "the simulated driver's resource is served")
        # The kubelet's default receive limit (4 MiB); sending has no limit, to reach the server's.
        options = [("grpc.max_send_message_length", -1)]
        channels = {
            r: grpc.aio.insecure_channel(f"unix:{shim.served[r].endpoint.socket_path}", options=options)
            for r in RESOURCES
        }
        watches = {(r, v): Watch() for r in RESOURCES for v in VERSIONS}
        for (resource, version), watch in watches.items():
            watch.task = asyncio.create_task(_follow(channels[resource], version, watch))
        await _until(lambda: all(_listed(w) for w in watches.values()), "every stream has its first list")
        result = Served(shim, channels, watches)
        expected = {
            r: (*((i, "Healthy") for i in HEALTHY[r]), (UNHEALTHY[r], "Unhealthy")) for r in RESOURCES
        }
        for (resource, _), watch in watches.items():
            assert watch.lists == [expected[resource]]
        try:
            yield result
        finally:
            for watch in watches.values():
                assert watch.task is not None
                watch.task.cancel()
                with suppress(asyncio.CancelledError):
                    await watch.task
            for channel in channels.values():
                await channel.close(None)


# --- what a request asks, and what devshim must answer ------------------------------------------

IdList = list[str]


def _long_id(pair: tuple[str, int]) -> str:
    return pair[0] * pair[1]


def device_ids(resource: str) -> st.SearchStrategy[str]:
    """Mostly the resource's IDs (healthy or not), else unknown ones: empty, short, non-ASCII,
    control characters, and IDs long enough to overflow a status message."""
    return st.one_of(
        st.sampled_from(KNOWN[resource]),
        st.sampled_from(KNOWN[resource]),
        st.text(st.characters(codec="utf-8"), max_size=12),
        st.just(""),
        st.tuples(st.characters(codec="utf-8"), st.integers(1_000, 300_000)).map(_long_id),
    )


def id_lists(resource: str) -> st.SearchStrategy[IdList]:
    """A few IDs with repeats, or (rarely) 10,000: one repeated, or each different."""
    many = st.one_of(
        st.sampled_from(KNOWN[resource]).map(lambda i: [i] * 10_000),
        st.just([f"unknown-{n}" for n in range(10_000)]),
        st.sampled_from(HEALTHY[resource]).map(lambda i: [*HEALTHY[resource], i] * 2_500),
    )
    few = st.lists(device_ids(resource), max_size=8)
    return st.one_of(few, few, few, many)


@st.composite
def targets(draw: st.DrawFn) -> tuple[str, str]:
    return draw(st.sampled_from(RESOURCES)), draw(st.sampled_from(tuple(VERSIONS)))


def unknown(resource: str, ids: Iterable[str]) -> bool:
    return any(i not in KNOWN[resource] for i in ids)


@dataclass(frozen=True)
class Expect:
    """What devshim may answer; ``check`` looks at an OK response."""

    codes: frozenset[grpc.StatusCode]
    check: Callable[[Any], None] = lambda response: None


def expect_allocate(resource: str, request: Any) -> Expect:
    containers = [list(c.devices_ids) for c in request.container_requests]
    ids = [i for c in containers for i in c]
    if unknown(resource, ids) or UNHEALTHY[resource] in ids:
        return Expect(frozenset({grpc.StatusCode.INVALID_ARGUMENT}))

    def check(response: Any) -> None:
        # One grant per container, in order, naming exactly that container's devices.
        assert len(response.container_responses) == len(containers)
        key = "FUZZ_DEVICES" if resource == STATIC else "SIM_DEVICES"
        for grant, wanted in zip(response.container_responses, containers, strict=True):
            assert set(filter(None, grant.envs[key].split(","))) == set(wanted)

    # The static source grants anything the core lets through; a driver may still refuse.
    codes = {grpc.StatusCode.OK} if resource == STATIC else HANDLER_CODES
    return Expect(frozenset(codes), check)


def expect_ids_known(resource: str, ids: Sequence[str]) -> Expect:
    """PreStartContainer, Deallocate, PostStopContainer: only unknown IDs are refused by the core."""
    if unknown(resource, ids):
        return Expect(frozenset({grpc.StatusCode.INVALID_ARGUMENT}))
    return Expect(frozenset({grpc.StatusCode.OK} if resource == STATIC else HANDLER_CODES))


def expect_preferred(resource: str, request: Any) -> Expect:
    containers = list(request.container_requests)

    def clearly_invalid(c: Any) -> bool:
        candidates = set(c.must_include_deviceIDs) | set(c.available_deviceIDs)
        return (
            unknown(resource, candidates)
            or c.allocation_size < 0
            or c.allocation_size > len(candidates)
            or c.allocation_size < len(set(c.must_include_deviceIDs))
        )

    def clearly_valid(c: Any) -> bool:
        must = list(c.must_include_deviceIDs)
        return not clearly_invalid(c) and len(set(must)) == len(must)

    def check(response: Any) -> None:
        # The kubelet's contract: exactly allocation_size IDs, every must-include ID among them,
        # each one from the request.
        assert len(response.container_responses) == len(containers)
        for chosen, c in zip(response.container_responses, containers, strict=True):
            ids = list(chosen.deviceIDs)
            assert len(ids) == len(set(ids)) == c.allocation_size
            assert set(c.must_include_deviceIDs) <= set(ids)
            assert set(ids) <= set(c.must_include_deviceIDs) | set(c.available_deviceIDs)

    if any(clearly_invalid(c) for c in containers):
        return Expect(frozenset({grpc.StatusCode.INVALID_ARGUMENT}))
    if all(clearly_valid(c) for c in containers):
        return Expect(frozenset({grpc.StatusCode.OK}), check)
    return Expect(frozenset(HANDLER_CODES), check)


def expect_options(resource: str, version: str) -> Expect:
    def check(response: Any) -> None:
        assert response.get_preferred_allocation_available
        assert response.pre_start_required
        if version == "v1beta2":
            assert response.deallocate_available == (resource == DRIVEN)
            assert response.post_stop_container_required == (resource == DRIVEN)

    return Expect(frozenset({grpc.StatusCode.OK}), check)


def expect(resource: str, version: str, method: str, request: Any) -> Expect:
    if method == "Allocate":
        return expect_allocate(resource, request)
    if method == "GetPreferredAllocation":
        return expect_preferred(resource, request)
    if method == "GetDevicePluginOptions":
        return expect_options(resource, version)
    return expect_ids_known(resource, list(request.devices_ids))


RESPONSE = {
    "Allocate": "AllocateResponse",
    "GetPreferredAllocation": "PreferredAllocationResponse",
    "PreStartContainer": "PreStartContainerResponse",
    "GetDevicePluginOptions": "DevicePluginOptions",
    "Deallocate": "DeallocateResponse",
    "PostStopContainer": "PostStopContainerResponse",
}
REQUEST = {
    "Allocate": "AllocateRequest",
    "GetPreferredAllocation": "PreferredAllocationRequest",
    "PreStartContainer": "PreStartContainerRequest",
    "GetDevicePluginOptions": "Empty",
    "Deallocate": "DeallocateRequest",
    "PostStopContainer": "PostStopContainerRequest",
}
UNARY = tuple(REQUEST)


def methods(version: str) -> tuple[str, ...]:
    """The unary methods ``version`` declares (v1beta2 adds Deallocate and PostStopContainer)."""
    service = VERSIONS[version].DESCRIPTOR.services_by_name["DevicePlugin"]
    declared = tuple(m.name for m in service.methods if not m.server_streaming)
    assert set(declared) <= set(UNARY), declared
    return declared


def tally(outcome: str) -> None:
    """Count ``outcome`` for --hypothesis-show-statistics (only inside a hypothesis test)."""
    if currently_in_test_context():
        event(outcome)


async def assert_handled(served: Served, resource: str, version: str, method: str, request: Message) -> None:
    """Send ``request``; the answer is one the core's rules allow, and a refusal changed nothing."""
    before = served.state()
    code, raw, details = await served.call(resource, version, method, request.SerializeToString())
    wanted = expect(resource, version, method, request)
    tally(f"{method}: {code.name}")
    assert code in wanted.codes, (code, details[:300])
    if code is grpc.StatusCode.OK:
        wanted.check(getattr(VERSIONS[version], RESPONSE[method]).FromString(raw))
        assert served.devices() == before["devices"]
    else:
        assert details, "a refusal says why"
        assert served.state() == before
    served.assert_no_new_list()


# --- requests built as messages -----------------------------------------------------------------


@st.composite
def allocate_requests(draw: st.DrawFn, resource: str, pb: ModuleType) -> Any:
    containers = draw(st.lists(id_lists(resource), max_size=3))
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )


SIZES = st.one_of(
    st.integers(-3, 6), st.integers(-(2**31), 2**31 - 1), st.sampled_from([-(2**31), 2**31 - 1])
)


@st.composite
def preferred_requests(draw: st.DrawFn, resource: str, pb: ModuleType) -> Any:
    containers = [
        pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=draw(id_lists(resource)),
            must_include_deviceIDs=draw(st.lists(device_ids(resource), max_size=4)),
            allocation_size=draw(SIZES),
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    return pb.PreferredAllocationRequest(container_requests=containers)


@examples(60)
@given(target=targets(), data=st.data())
async def test_allocate_answers_as_the_core_rules_and_a_refusal_changes_nothing(
    served: Served, target: tuple[str, str], data: st.DataObject
) -> None:
    """Allocate with any container list: unknown or Unhealthy IDs anywhere are INVALID_ARGUMENT
    and change nothing; otherwise one grant per container, in order."""
    resource, version = target
    request = data.draw(allocate_requests(resource, VERSIONS[version]))
    await assert_handled(served, resource, version, "Allocate", request)


@st.composite
def healthy_containers(draw: st.DrawFn, resource: str, pb: ModuleType) -> Any:
    """Two or three containers, each of different Healthy devices: a request the core must grant,
    so every example reaches the per-container check (the draws above seldom do, derandomized)."""
    sets = st.sets(st.sampled_from(HEALTHY[resource]), min_size=1).map(sorted)
    containers = draw(st.lists(sets, min_size=2, max_size=3, unique_by=tuple))
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )


@examples(30)
@given(target=targets(), data=st.data())
async def test_allocate_grants_several_containers_each_its_own_devices_in_order(
    served: Served, target: tuple[str, str], data: st.DataObject
) -> None:
    """Allocate for several containers of Healthy devices: OK, one grant per container, in the
    containers' order, each naming exactly that container's devices (issue 42, item 9)."""
    resource, version = target
    request = data.draw(healthy_containers(resource, VERSIONS[version]))
    code, raw, details = await served.call(resource, version, "Allocate", request.SerializeToString())
    assert code is grpc.StatusCode.OK, details[:300]
    expect_allocate(resource, request).check(getattr(VERSIONS[version], RESPONSE["Allocate"]).FromString(raw))


@examples(60)
@given(target=targets(), data=st.data())
async def test_preferred_allocation_keeps_the_kubelets_contract_or_refuses(
    served: Served, target: tuple[str, str], data: st.DataObject
) -> None:
    """GetPreferredAllocation with any sizes (negative, huge), must-include IDs outside the
    available ones, unknown IDs: exactly allocation_size IDs including every must-include one,
    or INVALID_ARGUMENT."""
    resource, version = target
    request = data.draw(preferred_requests(resource, VERSIONS[version]))
    await assert_handled(served, resource, version, "GetPreferredAllocation", request)


@examples(60)
@given(
    target=targets(),
    method=st.sampled_from(["PreStartContainer", "Deallocate", "PostStopContainer"]),
    data=st.data(),
)
async def test_calls_naming_devices_refuse_unknown_ones_and_change_nothing(
    served: Served, target: tuple[str, str], method: str, data: st.DataObject
) -> None:
    """PreStartContainer (both versions), Deallocate and PostStopContainer (v1beta2): unknown IDs
    are INVALID_ARGUMENT; known ones, duplicates and 10,000 of them are served."""
    resource, version = target
    if method not in methods(version):
        version = "v1beta2"
    pb = VERSIONS[version]
    request = getattr(pb, REQUEST[method])(devices_ids=data.draw(id_lists(resource)))
    await assert_handled(served, resource, version, method, request)


# --- requests as raw bytes ----------------------------------------------------------------------


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _length_delimited(number: int, body: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(body)) + body


@st.composite
def fields(draw: st.DrawFn, numbers: st.SearchStrategy[int]) -> bytes:
    """One well-formed field of any wire type: an unknown field, or a known number with the
    wrong type (which protobuf keeps as unknown)."""
    number = draw(numbers)
    wire_type = draw(st.sampled_from([0, 1, 2, 5]))
    if wire_type == 0:
        return _tag(number, 0) + _varint(draw(st.integers(0, 2**64 - 1)))
    if wire_type == 1:
        return _tag(number, 1) + draw(st.binary(min_size=8, max_size=8))
    if wire_type == 5:
        return _tag(number, 5) + draw(st.binary(min_size=4, max_size=4))
    return _length_delimited(number, draw(st.binary(max_size=40)))


@st.composite
def invalid_utf8_strings(draw: st.DrawFn, method: str) -> bytes:
    """A request whose device ID is not UTF-8 (proto3 requires it of string fields)."""
    bad = draw(st.binary(min_size=1, max_size=8).map(lambda b: b + b"\xff"))
    if method in ("Allocate", "GetPreferredAllocation"):
        return _length_delimited(1, _length_delimited(1, bad))
    return _length_delimited(1, bad)  # (Empty has no fields: there, an unknown one, which parses)


@st.composite
def raw_requests(draw: st.DrawFn, resource: str, version: str, method: str) -> bytes:
    """Bytes for ``method``: random; a valid encoding truncated, bit-flipped or with fields
    appended; a non-UTF-8 string."""
    pb = VERSIONS[version]
    valid: bytes
    if method == "Allocate":
        valid = draw(allocate_requests(resource, pb)).SerializeToString()
    elif method == "GetPreferredAllocation":
        valid = draw(preferred_requests(resource, pb)).SerializeToString()
    elif method == "GetDevicePluginOptions":
        valid = b""
    else:
        message = getattr(pb, REQUEST[method])(devices_ids=draw(st.lists(device_ids(resource), max_size=4)))
        valid = message.SerializeToString()
    kind = draw(st.sampled_from(["random", "truncated", "flipped", "extra_fields", "not_utf8"]))
    if kind == "random":
        return draw(st.binary(max_size=200))
    if kind == "truncated":
        return valid[: draw(st.integers(0, max(0, len(valid) - 1)))]
    if kind == "flipped" and valid:
        at = draw(st.integers(0, len(valid) - 1))
        return valid[:at] + bytes([valid[at] ^ draw(st.integers(1, 255))]) + valid[at + 1 :]
    if kind == "not_utf8":
        return draw(invalid_utf8_strings(method))
    extra = draw(
        st.lists(fields(st.one_of(st.integers(1, 5), st.integers(6, 2**29 - 1))), min_size=1, max_size=4)
    )
    return valid + b"".join(extra)


@st.composite
def raw_cases(draw: st.DrawFn) -> tuple[str, str, str, bytes]:
    resource, version = draw(targets())
    method = draw(st.sampled_from(methods(version)))
    return resource, version, method, draw(raw_requests(resource, version, method))


async def assert_raw_handled(served: Served, resource: str, version: str, method: str, raw: bytes) -> None:
    """Bytes that parse as the method's message are answered as that message would be; bytes that
    do not never reach a handler: grpc.aio answers UNKNOWN with the DecodeError. Either way a
    refusal changes nothing."""
    message_type = getattr(VERSIONS[version], REQUEST[method])
    before = served.state()
    code, response, details = await served.call(resource, version, method, raw)
    try:
        request = message_type.FromString(raw)
    except DecodeError:
        tally(f"{method}: unparsable, {code.name}")
        assert code is grpc.StatusCode.UNKNOWN, (code, details)
        assert details.startswith(UNPARSABLE), details
    else:
        wanted = expect(resource, version, method, request)
        tally(f"{method}: parsed, {code.name}")
        assert code in wanted.codes, (code, details[:300])
        if code is grpc.StatusCode.OK:
            wanted.check(getattr(VERSIONS[version], RESPONSE[method]).FromString(response))
            assert served.devices() == before["devices"]
    if code is not grpc.StatusCode.OK:
        assert served.state() == before
    served.assert_no_new_list()


@examples(120)
@given(case=raw_cases())
async def test_raw_request_bytes_are_handled_or_refused_by_grpc_before_any_handler(
    served: Served, case: tuple[str, str, str, bytes]
) -> None:
    """Random bytes, truncated or bit-flipped encodings, unknown fields and known field numbers
    with the wrong wire type, non-UTF-8 strings: answered as the message they parse to, or
    refused by grpc before any handler."""
    await assert_raw_handled(served, *case)


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_device_id_that_is_not_utf8_is_refused_by_grpc_for_every_method(
    served: Served, version: str
) -> None:
    """proto3 string fields must be UTF-8: the Python parser (upb) raises DecodeError ("String
    field had bad UTF-8"), so grpc.aio answers UNKNOWN before devshim's handler runs."""
    for method in methods(version):
        if method == "GetDevicePluginOptions":
            continue  # Empty has no string field
        inner = _length_delimited(1, b"dev\xff")
        raw = _length_delimited(1, inner) if method in ("Allocate", "GetPreferredAllocation") else inner
        code, _, details = await served.call(STATIC, version, method, raw)
        assert code is grpc.StatusCode.UNKNOWN, (method, code, details)
        assert details.startswith(UNPARSABLE) and details.endswith("String field had bad UTF-8"), details
        await assert_raw_handled(served, STATIC, version, method, raw)


@examples(4)
@given(target=targets(), data=st.data())
async def test_list_and_watch_with_junk_in_its_empty_request_still_lists_or_is_refused_by_grpc(
    served: Served, target: tuple[str, str], data: st.DataObject
) -> None:
    """ListAndWatch's request is Empty: unknown fields are ignored and the stream opens with the
    full list; bytes that do not parse are refused by grpc.aio (UNKNOWN) before the handler."""
    resource, version = target
    raw = data.draw(
        st.one_of(st.lists(fields(st.integers(1, 2**29 - 1)), max_size=3).map(b"".join), st.binary())
    )
    stream = served.channels[resource].unary_stream(f"/{version}.DevicePlugin/ListAndWatch", None, None)(raw)
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            first = await stream.read()
    except grpc.aio.AioRpcError as error:
        with pytest.raises(DecodeError):
            VERSIONS[version].Empty.FromString(raw)
        assert error.code() is grpc.StatusCode.UNKNOWN and (error.details() or "").startswith(UNPARSABLE)
    else:
        VERSIONS[version].Empty.FromString(raw)
        assert isinstance(first, bytes)
        listed = VERSIONS[version].ListAndWatchResponse.FromString(first)
        assert [d.ID for d in listed.devices] == list(KNOWN[resource])
    finally:
        stream.cancel()
    served.assert_no_new_list()


# --- sizes around the 4 MiB limit ---------------------------------------------------------------


def padded(valid: bytes, size: int) -> bytes:
    """``valid`` plus one unknown length-delimited field (number 1000), exactly ``size`` bytes."""
    room = size - len(valid)
    head = _tag(1000, 2)
    body = room - len(head) - len(_varint(room))
    # The length's own varint may be one byte shorter than estimated: settle it.
    while len(head) + len(_varint(body)) + body != room:
        body += room - (len(head) + len(_varint(body)) + body)
    return valid + head + _varint(body) + b"\0" * body


@examples(6)
@given(
    target=targets(),
    offset=st.integers(-3, 3),
    refused=st.booleans(),
    method=st.sampled_from(
        ["Allocate", "PreStartContainer", "GetPreferredAllocation", "GetDevicePluginOptions"]
    ),
)
@example(target=(STATIC, "v1beta1"), offset=0, refused=False, method="PreStartContainer")
@example(target=(STATIC, "v1beta2"), offset=1, refused=False, method="PreStartContainer")
@example(target=(DRIVEN, "v1beta1"), offset=0, refused=True, method="Allocate")
async def test_requests_up_to_4_mib_reach_the_handler_and_larger_ones_are_refused_by_grpc(
    served: Served, target: tuple[str, str], offset: int, refused: bool, method: str
) -> None:
    """The server keeps gRPC's default 4 MiB receive limit (like the kubelet's client): a
    request of exactly 4,194,304 bytes is handled, one byte more is RESOURCE_EXHAUSTED from grpc."""
    resource, version = target
    pb = VERSIONS[version]
    ids = ["no-such-device"] if refused else list(HEALTHY[resource][:1])
    request: Any
    if method == "Allocate":
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    elif method == "GetPreferredAllocation":
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=1)
            ]
        )
    elif method == "GetDevicePluginOptions":
        request = pb.Empty()
    else:
        request = pb.PreStartContainerRequest(devices_ids=ids)
    size = KUBELET_MAX_MESSAGE_BYTES + offset
    raw = padded(request.SerializeToString(), size)
    assert len(raw) == size
    before = served.state()
    code, response, details = await served.call(resource, version, method, raw)
    if size > KUBELET_MAX_MESSAGE_BYTES:
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert details.endswith(f"Received message larger than max ({size} vs. {KUBELET_MAX_MESSAGE_BYTES})")
        assert served.state() == before
    else:
        wanted = expect(resource, version, method, request)
        assert code in wanted.codes, (code, details[:300])
        if code is grpc.StatusCode.OK:
            wanted.check(getattr(pb, RESPONSE[method]).FromString(response))
    served.assert_no_new_list()


async def test_after_all_that_every_stream_still_holds_only_its_first_list(served: Served) -> None:
    """Late lists would show a change the requests caused after they were answered; the driver
    never failed (no restart), and every device kept its health."""
    await asyncio.sleep(0.3)
    served.assert_no_new_list()
    assert served.shim.drivers[0].failures == 0, served.shim.drivers[0].last_failure
    for resource in RESOURCES:
        assert [(d.id, d.health.value) for d in served.shim.services[resource].devices] == [
            *((i, "Healthy") for i in HEALTHY[resource]),
            (UNHEALTHY[resource], "Unhealthy"),
        ]

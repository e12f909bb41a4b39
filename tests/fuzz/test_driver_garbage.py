"""Garbage from a driver never crashes devshim.

Two levels, both real:

- the JSON-RPC Peer (shim/jsonrpc) reading hypothesis bytes from a real pipe, on devshim's strict
  side and the SDK's lenient one: it ends only with a ProtocolError or ConnectionClosed, never
  anything else, fails what is pending, and never hangs;
- one devshim, with a real driver subprocess (garbage_driver.py) that behaves and then writes
  each example's bytes: random and binary junk, truncated lines, lines over 32 MiB, wrong
  types, answers to ids devshim never used or already had answered, answers before their
  request, notifications with bad params, deep nesting, huge numbers, NaN and Infinity, invalid
  UTF-8. devshim stays up; the driver's devices stay listed (Unhealthy while it is broken, never
  gone); a broken driver is restarted for the protocol error it made; a notification it cannot
  use changes nothing; and Allocate, a round trip through the driver, works again after.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import pytest_asyncio
from hypothesis import event, example, given
from hypothesis import strategies as st

from shim.bootstrap import Shim
from shim.driverhost import DriverHost, protocol
from shim.generated.v1beta1 import api_pb2 as v1beta1
from shim.jsonrpc import MAX_LINE_BYTES, ConnectionClosed, Peer, RemoteError, StreamTransport
from shim.jsonrpc.errors import ErrorCode, ProtocolError
from shim.model import Health
from shim.settings import Settings
from tests.fuzz.profiles import examples
from tests.support import DRIVERS
from tests.support.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

DRIVER = DRIVERS / "garbage.py"
GARBAGE = "example.com/garbage"
STEADY = "example.com/steady"
DEVICES = ("g-0", "g-1")
NOTIFICATIONS = ("devices_changed", "health_changed", "resources_changed", "log")
WAIT_S = 30.0

# --- JSON, and what a driver could write -------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),  # json.dumps writes NaN and Infinity
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def _not_a_health(value: Any) -> bool:
    try:
        return value not in {"HEALTHY", "UNHEALTHY", 1, 2}  # True == 1: a health to Python too
    except TypeError:  # unhashable: surely none
        return True


bad_health = values.filter(_not_a_health)
not_an_object = st.one_of(scalars, st.lists(values, max_size=3))
truthy_not_a_list = st.one_of(
    st.just(True),
    st.integers().filter(bool),
    st.floats(allow_nan=True, allow_infinity=True).filter(bool),
    st.text(min_size=1, max_size=12),
    st.dictionaries(st.text(max_size=6), values, min_size=1, max_size=3),
)
good_device = st.sampled_from(DEVICES).map(lambda i: {"id": i, "health": "HEALTHY"})
bad_device = st.one_of(
    not_an_object,
    st.fixed_dictionaries(
        {"id": values.filter(lambda v: not (isinstance(v, str) and v)), "health": st.just("HEALTHY")}
    ),
    st.fixed_dictionaries({"id": st.sampled_from(DEVICES), "health": bad_health}),
    st.fixed_dictionaries(
        {
            "id": st.sampled_from(DEVICES),
            "health": st.just("HEALTHY"),
            "numa_nodes": truthy_not_a_list | st.just([-1]),
        }
    ),
)


@st.composite
def with_one_bad(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> list[Any]:
    items = draw(st.lists(good, max_size=3))
    items.insert(draw(st.integers(0, len(items))), draw(bad))
    return items


def ours(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"resource": st.just(GARBAGE), **fields})


# Params each notification's handler must refuse as a whole: none of these is a valid change of
# GARBAGE's devices or of the driver's resources (a valid one would be the driver's right).
bad_params = {
    "devices_changed": st.one_of(
        not_an_object,
        ours(devices=truthy_not_a_list),
        ours(devices=with_one_bad(good_device, bad_device)),
        ours(devices=st.just([{"id": "g-0", "health": "HEALTHY"}] * 2)),  # one ID twice
        st.fixed_dictionaries({"resource": values.filter(lambda v: v != GARBAGE), "devices": values}),
    ),
    "health_changed": st.one_of(
        not_an_object,
        ours(changes=truthy_not_a_list),
        ours(
            changes=with_one_bad(
                st.fixed_dictionaries({"id": values, "health": st.just("UNHEALTHY")}), not_an_object
            )
        ),
        ours(
            changes=st.lists(
                st.fixed_dictionaries({"id": values, "health": bad_health}), min_size=1, max_size=3
            )
        ),
    ),
    "resources_changed": st.one_of(
        not_an_object,
        st.fixed_dictionaries({"resources": truthy_not_a_list}),
        st.fixed_dictionaries(
            {
                "resources": with_one_bad(
                    st.just({"name": GARBAGE}),
                    not_an_object
                    | st.fixed_dictionaries(
                        {"name": values.filter(lambda v: not (isinstance(v, str) and v))}
                    ),
                )
            }
        ),
    ),
    "log": st.one_of(not_an_object, st.fixed_dictionaries({"level": values, "message": values})),
}


@st.composite
def bad_notifications(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(NOTIFICATIONS))
    return dumps({"jsonrpc": "2.0", "method": method, "params": draw(bad_params[method])})


@st.composite
def responses(draw: st.DrawFn, ids: st.SearchStrategy[bytes]) -> bytes:
    """An answer, well-formed or not, to an id from ``ids`` (raw JSON, so placeholders fit)."""
    body = draw(
        st.one_of(
            st.builds(lambda v: b'"result":' + dumps(v), values),
            st.builds(lambda v: b'"error":' + dumps(v), values),  # maybe no error object at all
            st.builds(
                lambda c, m: b'"error":' + dumps({"code": c, "message": m}),
                st.integers(-33000, 0),
                st.text(max_size=20),
            ),
        )
    )
    return b'{"jsonrpc":"2.0","id":' + draw(ids) + b"," + body + b"}"


driver_ids = st.one_of(
    st.just(b"{{LAST_ID}}"),  # answered already: a duplicate
    st.just(b"{{NEXT_ID}}"),  # not asked yet: an answer before its request
    values.map(dumps),  # ids devshim never used, of every JSON type
)
requests_to_devshim = st.builds(
    lambda i, m, p: dumps({"jsonrpc": "2.0", "id": i, "method": m, "params": p}),
    values,
    st.text(max_size=12).filter(lambda m: m not in NOTIFICATIONS),
    values,
)


def _deep(pair: tuple[bytes, bytes], depth: int) -> bytes:
    opener, closer = pair
    inner = b"1" if opener.endswith(b":") else b""
    return opener * depth + inner + closer * depth


nesting = st.builds(
    _deep, st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]), st.sampled_from([2_000, 100_000])
)
huge_numbers = st.builds(
    lambda digits, where: where.replace(b"N", b"7" * digits),
    st.sampled_from([4_301, 20_000]),
    st.sampled_from(
        [
            b'{"jsonrpc":"2.0","id":N,"result":{}}',
            b'{"jsonrpc":"2.0","method":"log","params":{"message":N}}',
            b"N",
        ]
    ),
)
special_floats = st.sampled_from(
    [
        b'{"jsonrpc":"2.0","id":NaN,"result":{}}',
        b'{"jsonrpc":"2.0","id":Infinity,"result":{}}',
        b'{"jsonrpc":"2.0","method":"log","params":{"level":NaN,"message":-Infinity}}',
        b'{"jsonrpc":"2.0","method":"log","params":{"message":1e999}}',
    ]
)


@st.composite
def not_utf8(draw: st.DrawFn, messages: st.SearchStrategy[bytes]) -> bytes:
    line = draw(messages)
    at = draw(st.integers(0, len(line)))
    return (
        line[:at]
        + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
        + line[at:]
    )


@st.composite
def truncated(draw: st.DrawFn, messages: st.SearchStrategy[bytes]) -> bytes:
    line = draw(messages)
    return line[: draw(st.integers(0, max(0, len(line) - 1)))]


def driver_lines(ids: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """One line's worth of what a broken driver may write (no newline)."""
    wellformed = st.one_of(responses(ids), bad_notifications(), requests_to_devshim)
    return st.one_of(
        st.binary(max_size=80),
        values.map(dumps),  # JSON, not JSON-RPC
        wellformed,
        wellformed,
        nesting,
        huge_numbers,
        special_floats,
        not_utf8(wellformed),
        truncated(wellformed),
    )


@st.composite
def driver_output(draw: st.DrawFn, ids: st.SearchStrategy[bytes]) -> bytes:
    """A few lines, mostly newline-separated; sometimes run together, or with a CR."""
    out = b""
    for line in draw(st.lists(driver_lines(ids), min_size=1, max_size=4)):
        out += line + draw(st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b""]))
    return out


# --- the Peer on a real pipe --------------------------------------------------------------------


@dataclass
class PeerRun:
    reasons: list[BaseException]
    pending: BaseException | Any  # what our one request (id 1) ended with
    output: list[Any]  # what the peer wrote back, each line parsed


def _write_all(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb", buffering=0) as pipe:
        pipe.write(data)


# devshim's own parsers of notification params, as the Peer's handlers (the driver host's
# handlers also need its sources; these raise the same DriverProtocolError on bad params).
def parse_devices(params: Any) -> None:
    protocol.devices_from_json(params)


def parse_resources(params: Any) -> None:
    protocol.resources_from_json(params)


def parse_health(params: Any) -> None:
    for change in protocol.field(params, "changes") or ():
        protocol.health_from_json(protocol.field(change, "health"))


async def feed_peer(data: bytes, *, strict: bool) -> PeerRun:
    """``data`` through a real pipe into a Peer with devshim's notification parsers; its output
    through another pipe. Bounded: the input ends, so must the peer."""
    loop = asyncio.get_running_loop()
    in_read, in_write = os.pipe()
    out_read, out_write = os.pipe()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_read, "rb", buffering=0)
    )
    write_transport, write_protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), os.fdopen(out_write, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)
    echo = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    echo_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(echo), os.fdopen(out_read, "rb", buffering=0)
    )
    reasons: list[BaseException] = []
    peer = Peer(
        StreamTransport(reader, writer),
        name="fuzzed",
        notifications={
            "devices_changed": parse_devices,
            "resources_changed": parse_resources,
            "health_changed": parse_health,
        },
        strict=strict,
    )
    peer.on_close = reasons.append
    try:
        running = asyncio.create_task(peer.run())
        asking = asyncio.create_task(peer.request("list_devices", {}, timeout=WAIT_S))
        await asyncio.to_thread(_write_all, in_write, data)
        async with asyncio.timeout(10):  # never hangs: the input ended
            try:
                await running
            except Exception as exc:  # what run() must never let out; said briefly (a deep
                # RecursionError's own traceback is more than pytest can print)
                raise AssertionError(f"Peer.run() raised {type(exc).__name__}: {str(exc)[:200]}") from None
            try:
                async with asyncio.timeout(5):
                    pending: Any = await asking
            except (ConnectionClosed, RemoteError) as exc:
                pending = exc
        await peer.close()
        output = [json.loads(line) for line in (await echo.read()).splitlines()]
    finally:
        for transport in (read_transport, write_transport, echo_transport):
            transport.close()
    return PeerRun(reasons, pending, output)


def parse_errors(data: bytes) -> int:
    """How many complete non-blank lines of ``data`` are not JSON (before a framing error). JSON
    as RFC 8259 has it, which is what the pipe's parser (orjson) accepts: no NaN or Infinity, no
    lone surrogates, nesting up to 1024 (docs/driver-protocol.md)."""
    *lines, _tail = data.split(b"\n")
    count = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            orjson.loads(line)
        except ValueError:
            count += 1
    return count


def framed(data: bytes) -> bool:
    """Every message of ``data`` ends with a newline (else the stream ends inside one)."""
    return not data.split(b"\n")[-1].strip()


plain_ids = st.one_of(st.just(b"1"), values.map(dumps))


@examples(150)
@given(data=driver_output(plain_ids))
@example(data=b"[" * 100_000 + b"]" * 100_000 + b"\n")
@example(data=b'{"jsonrpc":"2.0","id":' + b"7" * 5_000 + b',"result":1}\n')
@example(data=b'{"jsonrpc":"2.0","id":true,"result":{"devices":[]}}\n')
@example(data=b'{"jsonrpc":"2.0","method":"health_changed","params":{"resource":"r","changes":5}}\n')
async def test_devshims_strict_peer_ends_only_with_a_protocol_error_or_the_stream(data: bytes) -> None:
    """devshim's side: anything that is not JSON-RPC ends the connection with a ProtocolError
    (which the driver host turns into a restart); a notification its handler refuses is ignored;
    the stream's end is ConnectionClosed. Our pending request never hangs."""
    run = await feed_peer(data, strict=True)
    assert len(run.reasons) == 1
    reason = run.reasons[0]
    assert isinstance(reason, ProtocolError | ConnectionClosed), repr(reason)
    if parse_errors(data) or not framed(data):
        assert isinstance(reason, ProtocolError), (reason, data[:200])
    # Answered (an error object, or any result) or failed with the connection; JSON's true is no id.
    assert isinstance(run.pending, ConnectionClosed | RemoteError) or b'"id":1,' in data or b'"id":1}' in data
    # After our own request, only answers: devshim serves no requests, so a driver's request gets
    # "method not found"; junk gets no answer.
    assert run.output[0]["method"] == "list_devices"
    assert all(m["error"]["code"] == ErrorCode.METHOD_NOT_FOUND for m in run.output[1:]), run.output


@examples(100)
@given(data=driver_output(plain_ids))
@example(data=b"[" * 100_000 + b"]" * 100_000 + b"\nnot json\n")
@example(data=b'{"a":' * 2_000 + b"1" + b"}" * 2_000 + b"\n")
async def test_the_sdks_lenient_peer_answers_each_bad_line_and_reads_on(data: bytes) -> None:
    """The SDK's side (a driver reading devshim): every line that is not JSON is answered with a
    parse error and reading goes on; only broken framing ends the connection early."""
    run = await feed_peer(data, strict=False)
    assert len(run.reasons) == 1
    assert isinstance(run.reasons[0], ProtocolError | ConnectionClosed), repr(run.reasons[0])
    if framed(data):
        assert isinstance(run.reasons[0], ConnectionClosed), run.reasons[0]
        parse = [m for m in run.output[1:] if m["error"]["code"] == ErrorCode.PARSE_ERROR]
        assert len(parse) == parse_errors(data)


@pytest.mark.parametrize("strict", [True, False], ids=["devshim", "sdk"])
async def test_a_line_over_32_mib_is_a_protocol_error_for_both_peers(strict: bool) -> None:
    """The framing's limit holds on a real pipe: the reader refuses the line, it does not grow."""
    run = await feed_peer(
        b'{"jsonrpc":"2.0","method":"log","params":"' + b"x" * MAX_LINE_BYTES + b'"}\n', strict=strict
    )
    assert len(run.reasons) == 1 and isinstance(run.reasons[0], ProtocolError)
    assert "longer than" in str(run.reasons[0])
    assert isinstance(run.pending, ConnectionClosed)


# --- devshim with a real driver writing garbage --------------------------------------------------


@dataclass
class Stream:
    lists: list[tuple[tuple[str, str], ...]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


@dataclass
class Garbage:
    shim: Shim
    payloads: Path
    run_file: Path
    channels: dict[str, grpc.aio.Channel]
    streams: dict[str, Stream]
    numbers: Iterator[int] = field(default_factory=itertools.count)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # How hypothesis prints this fixture beside a failing example: briefly, not field by field.
        printer.text("<devshim with the garbage driver>")

    @property
    def host(self) -> DriverHost:
        return self.shim.drivers[0]

    def runs(self) -> int:
        return sum(line.startswith("start ") for line in self.run_file.read_text().splitlines())

    def healthy(self) -> bool:
        devices = self.shim.services[GARBAGE].devices
        return [d.id for d in devices] == list(DEVICES) and all(d.health is Health.HEALTHY for d in devices)

    async def send(self, data: bytes) -> None:
        """Hand the driver ``data``; return once a run of it has taken the bytes."""
        number = next(self.numbers)
        staged = self.payloads / f"{number:06}.tmp"
        staged.write_bytes(data)
        staged.rename(staged.with_suffix(".bin"))
        await until(lambda: staged.with_suffix(".taken").exists(), "the driver takes the payload")

    async def allocate(self, device: str) -> tuple[grpc.StatusCode, str]:
        request = v1beta1.AllocateRequest(
            container_requests=[v1beta1.ContainerAllocateRequest(devices_ids=[device])]
        )
        rpc = self.channels[GARBAGE].unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)
        try:
            raw = await rpc(request.SerializeToString(), timeout=WAIT_S)
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
        response = v1beta1.AllocateResponse.FromString(raw)
        return grpc.StatusCode.OK, response.container_responses[0].envs["GARBAGE"]


async def _follow(channel: grpc.aio.Channel, stream: Stream) -> None:
    # The endpoint's task may not have bound its socket yet: wait for it as a kubelet's retry would.
    listing = channel.unary_stream("/v1beta1.DevicePlugin/ListAndWatch", None, None)
    async for raw in listing(b"", wait_for_ready=True):
        message = v1beta1.ListAndWatchResponse.FromString(raw)
        stream.lists.append(tuple((d.ID, d.health) for d in message.devices))


@pytest.fixture(scope="module")
def dirs() -> Iterator[tuple[Path, Path, Path]]:
    with (
        tempfile.TemporaryDirectory(prefix="ds-", dir="/tmp") as plugins,
        tempfile.TemporaryDirectory(prefix="ds-state-", dir="/tmp") as state,
        tempfile.TemporaryDirectory(prefix="ds-garbage-") as payloads,
    ):
        yield Path(plugins), Path(state), Path(payloads)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def garbage(dirs: tuple[Path, Path, Path]) -> AsyncIterator[Garbage]:
    """devshim serving a static resource and the garbage driver's, a ListAndWatch stream on each
    (no kubelet: the endpoints serve and wait to register)."""
    plugins, state, payloads = dirs
    run_file = payloads / "runs"
    settings = Settings.load(
        device_plugins_dir=plugins,
        state_dir=state,
        register_backoff_max_s=5,
        deallocation={"enabled": False},
        resources=[{"name": STEADY, "static": {"count": 1}}],
        drivers=[
            {
                "name": "garbage",
                "user": "root",
                "command": [sys.executable, str(DRIVER)],
                "env": {"RUN_FILE": str(run_file), "PAYLOAD_DIR": str(payloads)},
                # Quick restarts keep the examples quick; a merged half line may leave an
                # allocate unanswered, which is then a hang: 5 s, not 20.
                "restart": {"backoff_initial_s": 0.01, "backoff_max_s": 0.05, "call_wait_s": 20},
                "timeouts": {"allocate_s": 5},
                "resources": [GARBAGE],
                "policy": {"envs": ["GARBAGE"]},
            }
        ],
    )
    async with Shim(settings) as shim:
        await until(lambda: GARBAGE in shim.served, "the driver's resource is served")
        channels = {
            r: grpc.aio.insecure_channel(f"unix:{shim.served[r].endpoint.socket_path}")
            for r in (GARBAGE, STEADY)
        }
        streams = {r: Stream() for r in channels}
        for resource, stream in streams.items():
            stream.task = asyncio.create_task(_follow(channels[resource], stream))
        result = Garbage(shim, payloads, run_file, channels, streams)
        await until(lambda: all(s.lists for s in streams.values()) and result.healthy(), "both are listed")
        try:
            yield result
        finally:
            for stream in streams.values():
                assert stream.task is not None
                stream.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stream.task
            for channel in channels.values():
                await channel.close(None)


async def assert_recovers(garbage: Garbage, data: bytes) -> None:
    """After ``data``: Allocate through the driver works again (meanwhile only the documented
    UNAVAILABLE or DEADLINE_EXCEEDED), the devices are Healthy, and what happened in between is
    what the protocol says."""
    failures, runs = garbage.host.failures, garbage.runs()
    seen = len(garbage.streams[GARBAGE].lists)
    early_answer = b"{{NEXT_ID}}" in data
    await garbage.send(data)
    async with asyncio.timeout(2 * WAIT_S):
        while (answer := await garbage.allocate("g-0")) != (grpc.StatusCode.OK, "g-0"):
            if answer[0] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                continue
            # An answer written before its request reaches devshim either first (an id it never
            # used: a protocol error) or after devshim sent that request, our next Allocate: then
            # it is that call's answer, an error or malformed, and the call fails as the driver
            # said (docs/driver-protocol.md, "Errors"). The pipe's timing picks; both are right.
            assert early_answer and answer[1].startswith("driver 'garbage': allocate: "), answer
    await until(
        lambda: garbage.healthy() and garbage.host.status == "up", "the driver is up and its devices Healthy"
    )
    lists = garbage.streams[GARBAGE].lists
    # Never dropped: a device missing from a list is removed from the node by the kubelet.
    assert all([i for i, _ in devices] == list(DEVICES) for devices in lists), lists[seen:]
    if garbage.host.failures > failures:
        reason = garbage.host.last_failure
        event(f"driver restarted: {reason.split(':')[0]}")  # --hypothesis-show-statistics
        # Named for what the driver did; "closed its output but kept running" would mean devshim's
        # reader died of the bytes instead of refusing them.
        assert reason.startswith(("it broke the protocol", "it did not answer allocate")), reason
        assert garbage.runs() > runs, "restarted"
        await until(lambda: lists[-1] == tuple((i, "Healthy") for i in DEVICES), "the Healthy list is sent")
        assert any(all(h == "Unhealthy" for _, h in devices) for devices in lists[seen:]), lists[seen:]
    else:
        event("driver kept: nothing it wrote broke the protocol")
        assert garbage.runs() == runs
        assert len(lists) == seen, lists[seen:]  # a refused notification changed nothing
    # The static resource beside it never noticed.
    assert garbage.streams[STEADY].lists == [(("dev0", "Healthy"),)]
    assert all(not served.task.done() for served in garbage.shim.served.values())
    assert not garbage.host.gave_up.is_set()


@examples(50)
@given(data=driver_output(driver_ids))
@example(data=b"{{OVERSIZED}}")
@example(data=b'{{HOLD}}{"jsonrpc":"2.0","id":{{NEXT_ID}},"result":[1]}\n')  # meets its request
@example(data=b"[" * 100_000 + b"]" * 100_000 + b"\n")
@example(
    data=b'{"jsonrpc":"2.0","method":"health_changed","params":{"resource":"example.com/garbage","changes":5}}\n'
)
async def test_devshim_survives_any_driver_output_and_the_driver_comes_back(
    garbage: Garbage, data: bytes
) -> None:
    """Whatever the driver writes between requests, devshim keeps serving both resources, lists
    the driver's devices throughout, restarts it if the bytes broke the protocol, and answers
    Allocate through it again."""
    await assert_recovers(garbage, data)

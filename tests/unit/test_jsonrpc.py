"""The JSON-RPC peer over a real socket pair: concurrency, framing limits, broken peers."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shim.jsonrpc import ConnectionClosed, ErrorCode, Peer, RemoteError, StreamTransport
from shim.jsonrpc.errors import ProtocolError

LIMIT = 1024


async def transport_pair() -> tuple[StreamTransport, tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """Our side as a transport (small line limit), the other side as raw streams."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours, limit=LIMIT)
    raw = await asyncio.open_connection(sock=theirs)
    return StreamTransport(reader, writer), raw


@pytest.fixture
async def peers() -> AsyncIterator[tuple[Peer, Peer]]:
    """Two connected peers; the 'driver' one answers echo and a slow method."""

    async def echo(params: Any) -> Any:
        return params

    async def slow(params: Any) -> Any:
        await asyncio.sleep(0.5)
        return "slow"

    async def fail(params: Any) -> Any:
        raise RemoteError(ErrorCode.UNKNOWN_DEVICE, "no such device")

    async def unsendable(params: Any) -> Any:
        return {"big": 2**70}

    a, b = socket.socketpair()
    host = Peer(StreamTransport(*await asyncio.open_connection(sock=a)), name="host")
    driver = Peer(
        StreamTransport(*await asyncio.open_connection(sock=b)),
        name="driver",
        requests={"echo": echo, "slow": slow, "fail": fail, "unsendable": unsendable},
        strict=False,
    )
    tasks = [asyncio.create_task(host.run()), asyncio.create_task(driver.run())]
    yield host, driver
    await host.close()
    await driver.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_requests_in_flight_do_not_wait_for_each_other(peers: tuple[Peer, Peer]) -> None:
    """A slow request started first does not hold up a quick one sent after it."""
    host, _ = peers
    done: list[str] = []

    async def call(method: str) -> None:
        await host.request(method, {"n": 1}, timeout=5)
        done.append(method)

    await asyncio.gather(call("slow"), call("echo"))
    assert done == ["echo", "slow"]


async def test_error_objects_and_unknown_methods_come_back_as_remote_errors(peers: tuple[Peer, Peer]) -> None:
    """A handler's RemoteError keeps its code; an unknown method is -32601."""
    host, _ = peers
    with pytest.raises(RemoteError) as info:
        await host.request("fail", {}, timeout=5)
    assert info.value.code == ErrorCode.UNKNOWN_DEVICE
    with pytest.raises(RemoteError) as info:
        await host.request("nope", {}, timeout=5)
    assert info.value.code == ErrorCode.METHOD_NOT_FOUND


async def test_an_answer_that_is_not_json_comes_back_as_an_internal_error(peers: tuple[Peer, Peer]) -> None:
    """A handler's result JSON cannot carry is still answered (with -32603), not left to time out."""
    host, _ = peers
    with pytest.raises(RemoteError) as info:
        await host.request("unsendable", {}, timeout=5)
    assert info.value.code == ErrorCode.INTERNAL_ERROR
    assert "not JSON" in info.value.message and "64-bit" in info.value.message
    assert await host.request("echo", [1], timeout=5) == [1]


async def test_a_request_past_its_timeout_raises_timeout(peers: tuple[Peer, Peer]) -> None:
    """No answer in time is a TimeoutError, and the peer keeps working afterwards."""
    host, _ = peers
    with pytest.raises(TimeoutError):
        await host.request("slow", {}, timeout=0.05)
    assert await host.request("echo", [1], timeout=5) == [1]


async def test_a_notification_reaches_its_handler() -> None:
    """Notifications are dispatched by method to their handler, with their params."""
    ours, (_, their_writer) = await transport_pair()
    got: list[Any] = []
    peer = Peer(ours, name="host", notifications={"log": got.append})
    task = asyncio.create_task(peer.run())
    their_writer.write(b'{"jsonrpc":"2.0","method":"log","params":{"message":"hi"}}\n')
    their_writer.close()
    async with asyncio.timeout(5):
        await task
    assert got == [{"message": "hi"}]


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"this is not json\n", id="not-json"),
        pytest.param(b'{"jsonrpc":"2.0","id":99,"result":1}\n', id="unknown-response-id"),
        pytest.param(b'{"id":1,"result":1}\n', id="not-jsonrpc"),
        pytest.param(b"x" * (LIMIT * 2) + b"\n", id="oversized-line"),
    ],
)
async def test_a_strict_peer_facing_garbage_fails_pending_calls_and_closes(garbage: bytes) -> None:
    """devshim's side ends a connection that breaks the protocol; calls waiting on it fail at once
    with ConnectionClosed naming the reason, and on_close runs exactly once."""
    ours, (_, their_writer) = await transport_pair()
    peer = Peer(ours, name="driver 'x'")
    closed: list[BaseException] = []
    peer.on_close = closed.append
    runner = asyncio.create_task(peer.run())
    pending = asyncio.create_task(peer.request("allocate", {}, timeout=30))
    await asyncio.sleep(0.05)
    their_writer.write(garbage)
    await their_writer.drain()
    with pytest.raises(ConnectionClosed, match="driver 'x'"):
        async with asyncio.timeout(5):
            await pending
    async with asyncio.timeout(5):
        await runner
    assert len(closed) == 1 and isinstance(closed[0], ProtocolError)
    assert peer.closed
    their_writer.close()


async def test_a_lenient_peer_answers_garbage_with_an_error_object() -> None:
    """The SDK side answers bad input with -32700 (id null) and keeps serving."""
    ours, (their_reader, their_writer) = await transport_pair()

    async def echo(params: Any) -> Any:
        return params

    peer = Peer(ours, name="driver", requests={"echo": echo}, strict=False)
    task = asyncio.create_task(peer.run())
    their_writer.write(b'not json\n{"jsonrpc":"2.0","id":7,"method":"echo","params":[7]}\n')
    async with asyncio.timeout(5):
        line = await their_reader.readline()
    first = json.loads(line)
    async with asyncio.timeout(5):
        line = await their_reader.readline()
    second = json.loads(line)
    assert first["error"]["code"] == ErrorCode.PARSE_ERROR and first["id"] is None
    assert second == {"jsonrpc": "2.0", "id": 7, "result": [7]}
    their_writer.close()
    async with asyncio.timeout(5):
        await task


async def test_end_of_stream_fails_pending_requests() -> None:
    """A driver that exits mid-call: the caller gets ConnectionClosed, not a hang."""
    ours, (_, their_writer) = await transport_pair()
    peer = Peer(ours, name="driver 'y'")
    runner = asyncio.create_task(peer.run())
    pending = asyncio.create_task(peer.request("allocate", {}, timeout=30))
    await asyncio.sleep(0.05)
    their_writer.close()
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(5):
            await pending
    await runner
    with pytest.raises(ConnectionClosed):
        await peer.request("allocate", {}, timeout=1)

"""The lean GET of DRA's claim reads (shim/dra/http.py) against a real socket server speaking
canned HTTP/1.1: lengths and chunks, kept connections, a server that closes one while idle, and
answers it must refuse rather than read without bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from shim.dra.http import MAX_BODY_BYTES, Getter, HttpError

Answer = Callable[[bytes], bytes]  # the request's head -> what the server writes back


@asynccontextmanager
async def server(answer: Answer, close_after: int = 0) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on 127.0.0.1; yields its URL and the number of connections it accepted so far
    (a one-item list). ``close_after``: requests per connection before it closes (0: never)."""
    accepted = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(answer(head))
                await writer.drain()
                served += 1
                if close_after and served >= close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    listening = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        listening.close()


def with_length(body: bytes, status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def chunked(*chunks: bytes) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for chunk in chunks:
        out += f"{len(chunk):x};ext=1\r\n".encode() + chunk + b"\r\n"
    return out + b"0\r\nX-Trailer: t\r\n\r\n"


async def test_a_body_by_length_and_by_chunks_over_one_kept_connection() -> None:
    answers = iter([with_length(b'{"a": 1}'), chunked(b'{"b":', b" 2}")])
    heads: list[bytes] = []

    def answer(head: bytes) -> bytes:
        heads.append(head)
        return next(answers)

    async with server(answer) as (url, accepted):
        getter = Getter(url, None, {"Authorization": "Bearer t"})
        first = await getter.get("/apis/x", 5)
        second = await getter.get("/apis/y", 5)
        getter.close()
    assert (first.status, first.body, second.body) == (200, b'{"a": 1}', b'{"b": 2}')
    assert accepted[0] == 1  # the second GET reused the first's connection
    assert heads[0].startswith(b"GET /apis/x HTTP/1.1\r\n") and b"Authorization: Bearer t\r\n" in heads[0]


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async with server(lambda head: with_length(b"{}"), close_after=1) as (url, accepted):
        getter = Getter(url, None, {})
        assert (await getter.get("/a", 5)).body == b"{}"
        assert (await getter.get("/b", 5)).body == b"{}"
        getter.close()
    assert accepted[0] == 2


@pytest.mark.parametrize(
    ("answer", "fragment"),
    [
        (b"SPDY/3 200 OK\r\n\r\n", "not an HTTP/1.1 answer"),
        (b"HTTP/1.1 200 OK\r\n\r\n", "without a length"),
        (f"HTTP/1.1 200 OK\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode(), "over"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "a chunk size"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n", "head over"),
    ],
)
async def test_an_answer_it_cannot_read_in_bounds_is_refused(answer: bytes, fragment: str) -> None:
    async with server(lambda head: answer) as (url, _):
        getter = Getter(url, None, {})
        with pytest.raises(HttpError, match=fragment):
            await getter.get("/c", 5)
        getter.close()


async def test_a_server_that_never_answers_times_out_and_a_bad_path_is_refused() -> None:
    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # holds the connection open, answering nothing

    listening = await asyncio.start_server(never, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}"
    try:
        getter = Getter(url, None, {})
        with pytest.raises(TimeoutError):
            await getter.get("/d", 0.2)
        with pytest.raises(ValueError, match="not a request path"):
            await getter.get("/d HTTP/1.1\r\nX: y", 5)
    finally:
        listening.close()

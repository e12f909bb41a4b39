"""A tiny HTTP/1.1 server for Prometheus and the kubelet's probes: /metrics, /healthz, /readyz, /status.

One request per connection (``Connection: close``), GET and HEAD only, the request head
bounded and read with a deadline: a scraper or a probe needs no more, and a stray or
hostile client can cost a connection but never the server. At most ``MAX_CONNECTIONS`` at once:
the server accepts no more until one ends (the rest wait in the kernel's queue, costing devshim
nothing), and while it is full, a connection that has sent nothing for ``IDLE_S`` is dropped,
so idle clients cannot keep a probe out. /metrics, the costly answer, and /status from another
host are limited to ``MAX_COSTLY_PER_S`` a second (beyond: 429, held a while first, so a flood
of N clients asks about N/2 times a second and no faster); the probes and the rest are never
refused, but beyond ``MAX_CHEAP_PER_S`` a second they too are held a while before their answer.
What they read of the serving loop is read there at most once per ``FRESH_S``.
/status names sockets, pids and errors: it answers only clients on this host unless
``status_from_anywhere``. runtime.py
runs the server on a thread and event loop of its own (OpsThread), so a flood of scrapes does
not wait in line with the kubelet's calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shim.ops.series import REGISTRY

MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 512
IDLE_S = 1.0
BACKLOG = 128
MAX_COSTLY_PER_S = 20
RETRY_AFTER_S = 2
MAX_CHEAP_PER_S = 100
CHEAP_HOLD_S = 0.5
FRESH_S = 0.2
# How long the ops thread waits for the serving loop to compute /readyz or /status.
SERVING_WAIT_S = 5.0
T = TypeVar("T")
TEXT = "text/plain; charset=utf-8"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}

Response = tuple[int, str, bytes]  # status, content type, body


class BadRequest(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


class OpsServer:
    """/metrics from ``REGISTRY``; /readyz and /status from the given callables (the Shim's)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ready: Callable[[], tuple[bool, str]],
        status: Callable[[], dict[str, Any]],
        status_from_anywhere: bool = False,
        costly_per_s: int = MAX_COSTLY_PER_S,
        max_connections: int = MAX_CONNECTIONS,
        cheap_per_s: int = MAX_CHEAP_PER_S,
    ) -> None:
        self._host = host
        self._max_connections = max_connections
        self._alive: Callable[[], object] | None = None
        self._port = port
        self._ready = ready
        self._status = status
        self._status_from_anywhere = status_from_anywhere
        self._costly = _Rate(costly_per_s)
        self._cheap = _Rate(cheap_per_s)
        self._listening: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._routes: dict[str, Callable[[], Response]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY)),
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/status": lambda: (200, "application/json", json.dumps(self._status(), default=str).encode()),
        }
        self._connections: dict[asyncio.Task[Any], socket.socket] = {}
        self._ended = asyncio.Event()  # a connection ended: the accept loop may go on
        self._reading: dict[asyncio.Task[Any], float] = {}  # connections still sending, since when

    @property
    def port(self) -> int:
        """The bound port once started (so port 0 picks a free one), else the one asked for."""
        return self._port if self._listening is None else int(self._listening.getsockname()[1])

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        self._listening = socket.create_server((self._host, self._port), family=family, backlog=BACKLOG)
        self._listening.setblocking(False)
        self._accepting = asyncio.create_task(self._accept(self._listening))
        # Not logged here: the process that starts the server says where it listens, once.

    async def stop(self) -> None:
        listening, self._listening = self._listening, None
        if listening is None:
            return
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        listening.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _accept(self, listening: socket.socket) -> None:
        """Accept while there is room; while full, drop an idle connection once it is one."""
        loop = asyncio.get_running_loop()
        while True:
            while len(self._connections) >= self._max_connections:
                self._ended.clear()
                oldest = min(self._reading.items(), key=lambda item: item[1], default=None)
                if oldest is not None and loop.time() - oldest[1] >= IDLE_S:
                    oldest[0].cancel()  # it has sent nothing for a while: make room
                    self._reading.pop(oldest[0], None)
                wait_s = IDLE_S if oldest is None else max(oldest[1] + IDLE_S - loop.time(), 0.01)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._ended.wait()
            try:
                connection, _ = await loop.sock_accept(listening)
            except OSError as exc:  # out of file descriptors, say: try again shortly
                logger.warning("ops: accept failed: {}", exc)
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._serve(connection))
            self._connections[task] = connection
            self._reading[task] = loop.time()
            task.add_done_callback(self._end)

    def _end(self, task: asyncio.Task[Any]) -> None:
        # Closed here too: a task cancelled before it ran never closed its socket.
        self._connections.pop(task).close()
        self._reading.pop(task, None)
        self._ended.set()

    async def _serve(self, connection: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=connection, limit=MAX_HEAD_BYTES)
        except OSError:
            connection.close()
            return
        try:
            await self._answer(reader, writer)
        except asyncio.CancelledError:
            if self._listening is None:
                raise  # stopping
            # dropped to make room
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client left before its answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = False
        task = asyncio.current_task()
        assert task is not None
        try:
            method, path = await _read_request(reader)
            self._reading.pop(task, None)
            head = method == "HEAD"
            guarded = self._guard(path, writer)
            if guarded is None and self._cheap.over(asyncio.get_running_loop().time()):
                await asyncio.sleep(CHEAP_HOLD_S * random.uniform(0.5, 1.5))  # a flood of probes
            status, content_type, body = guarded or self._route(method, path)
        except BadRequest as exc:
            status, content_type, body = exc.status, TEXT, f"{exc}\n".encode()
        if status == 429:
            # Held a while before the refusal: a client that asks again at once (a flood) then
            # asks about once a second, instead of keeping this thread, and the GIL, busy. The
            # hold varies, so a flood's clients spread out instead of coming back as one burst.
            await asyncio.sleep(RETRY_AFTER_S * random.uniform(0.5, 1.5))
        extra = (
            "Allow: GET, HEAD\r\n"
            if status == 405
            else f"Retry-After: {RETRY_AFTER_S}\r\n"
            if status == 429
            else ""
        )
        writer.write(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode("latin-1")
        )
        if not head:
            writer.write(body)
        await writer.drain()

    def _guard(self, path: str, writer: asyncio.StreamWriter) -> Response | None:
        """A refusal for /status from another host, or for a costly request over the rate. /status
        asked on this host is not counted: `devshim status` and local tools poll it, and it is
        this host's alone unless status_from_anywhere."""
        remote = path == "/status" and not _local(writer)
        if remote and not self._status_from_anywhere:
            return 403, TEXT, b"/status answers only on this host (http.status_from_anywhere)\n"
        if (path == "/metrics" or remote) and self._costly.over(asyncio.get_running_loop().time()):
            why = f"over {self._costly.per_s} /metrics and /status requests a second\n"
            return 429, TEXT, why.encode()
        return None

    def _route(self, method: str, path: str) -> Response:
        route = self._routes.get(path)
        if route is None:
            return 404, TEXT, b"not found\n"
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"only GET and HEAD\n"
        try:
            return route()
        except Exception as exc:
            logger.exception("ops: {} failed", path)
            return 500, TEXT, f"{type(exc).__name__}: {exc}\n".encode()

    def reads_on(self, serving: asyncio.AbstractEventLoop, wait_s: float) -> None:
        """For serving from another thread: compute /readyz and /status on the ``serving`` loop,
        and answer /healthz only once that loop does (500 after ``wait_s``)."""
        self._ready, self._status = _on(serving, self._ready, wait_s), _on(serving, self._status, wait_s)
        self._alive = _on(serving, lambda: None, wait_s)

    def _healthz(self) -> Response:
        """ok once the serving loop answers (``alive`` raises if it does not in time); without
        ``alive`` this server runs on the serving loop, and answering at all shows it alive."""
        if self._alive is not None:
            self._alive()
        return 200, TEXT, b"ok\n"

    def _readyz(self) -> Response:
        ready, reason = self._ready()
        return (200 if ready else 503), TEXT, f"{reason}\n".encode()


class _Rate:
    """Requests counted per whole second of a clock."""

    def __init__(self, per_s: int) -> None:
        self.per_s = per_s
        self._second = 0
        self._count = 0

    def over(self, now: float) -> bool:
        """Count one request now: is it over the rate?"""
        if int(now) != self._second:
            self._second, self._count = int(now), 0
        self._count += 1
        return self._count > self.per_s


def _local(writer: asyncio.StreamWriter) -> bool:
    peer = writer.get_extra_info("peername")
    try:
        return isinstance(peer, tuple) and ipaddress.ip_address(peer[0]).is_loopback
    except ValueError:
        return False


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and path of a request; its headers and any body are not needed."""
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest(431, f"request head over {MAX_HEAD_BYTES} bytes") from None
    except TimeoutError:
        raise BadRequest(408, f"no complete request within {READ_TIMEOUT_S:g} s") from None
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1") or not parts[1].startswith("/"):
        raise BadRequest(400, "malformed request line")
    method, target, _ = parts
    return method, target.split("?", 1)[0]


class OpsThread:
    """An OpsServer on a thread and event loop of its own, so that its work (a /metrics scrape,
    or a flood of them) never waits in line with the kubelet's calls on the serving loop (the
    one running now), which still computes what the server reads of it (OpsServer.reads_on)."""

    def __init__(self, server: OpsServer, serving_wait_s: float = SERVING_WAIT_S) -> None:
        server.reads_on(asyncio.get_running_loop(), serving_wait_s)
        self._server = server
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="devshim-ops", daemon=True)

    @property
    def port(self) -> int:
        return self._server.port

    async def start(self) -> None:
        """Listen (OSError if the address cannot be bound) and serve on the ops thread."""
        self._thread.start()
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._server.start(), self._loop))
        except BaseException:
            await self._end_thread()
            raise

    async def stop(self) -> None:
        if self._thread.is_alive():
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop))
        await self._end_thread()

    async def _end_thread(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)
        self._loop.close()


def _on(loop: asyncio.AbstractEventLoop, read: Callable[[], T], wait_s: float) -> Callable[[], T]:
    """``read`` made callable from another thread: run on ``loop``, waited for at most ``wait_s``,
    and an answer reused for ``FRESH_S`` (a flood of probes costs that loop little)."""
    last: list[tuple[float, T]] = []

    async def on_loop() -> T:
        return read()

    def call() -> T:
        now = time.monotonic()
        if last and now - last[0][0] < FRESH_S:
            return last[0][1]
        value = asyncio.run_coroutine_threadsafe(on_loop(), loop).result(wait_s)
        last[:] = [(now, value)]
        return value

    return call

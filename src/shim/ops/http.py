"""A tiny HTTP/1.1 server for Prometheus and the kubelet's probes: /metrics, /healthz, /readyz, /status.

One request per connection (``Connection: close``), GET and HEAD only, the request head
bounded and read with a deadline: a scraper or a probe needs no more, and a stray or
hostile client can cost a connection but never the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shim.ops.metrics import REGISTRY

MAX_HEAD_BYTES = 8192
READ_TIMEOUT_S = 10.0
TEXT = "text/plain; charset=utf-8"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
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
    ) -> None:
        self._host = host
        self._port = port
        self._ready = ready
        self._status = status
        self._server: asyncio.Server | None = None
        self._routes: dict[str, Callable[[], Response]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY)),
            "/healthz": lambda: (200, TEXT, b"ok\n"),  # answered at all: the event loop is alive
            "/readyz": self._readyz,
            "/status": lambda: (200, "application/json", json.dumps(self._status(), default=str).encode()),
        }
        self._connections: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        """The bound port once started (so port 0 picks a free one), else the one asked for."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port, limit=MAX_HEAD_BYTES)
        logger.info("ops: serving /metrics, /healthz, /readyz and /status on {}:{}", self._host, self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._answer(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client left before its answer
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = False
        try:
            method, path = await _read_request(reader)
            head = method == "HEAD"
            status, content_type, body = self._route(method, path)
        except BadRequest as exc:
            status, content_type, body = exc.status, TEXT, f"{exc}\n".encode()
        extra = "Allow: GET, HEAD\r\n" if status == 405 else ""
        writer.write(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode("latin-1")
        )
        if not head:
            writer.write(body)
        await writer.drain()

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

    def _readyz(self) -> Response:
        ready, reason = self._ready()
        return (200 if ready else 503), TEXT, f"{reason}\n".encode()


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

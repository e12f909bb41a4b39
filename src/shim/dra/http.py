"""A lean HTTP/1.1 GET over kept-alive TLS connections, for the one read on DRA's hot path.

NodePrepareResources reads each claim from the API server. Through kr8s (httpx over anyio) that
read cost devshim's loop about 1.5 ms of CPU a claim, most of a flood's (bench/dra_flood.py);
this client writes one request and parses one response with asyncio's streams, in C where it
can. It does GETs of JSON and nothing else: no redirects, no proxies, no compression (it asks
for none), bodies by Content-Length or chunked, every size bounded. What it cannot do (a proxy,
an answer it does not understand) the caller does through kr8s instead.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024  # status line and headers
MAX_BODY_BYTES = 16 * 1024 * 1024  # a ResourceClaim is a few KB; etcd's own limit is 1.5 MB
IDLE_CONNECTIONS = 4  # kept for reuse; DRA prepares two claims at once (dra/preparer.py)


class HttpError(Exception):
    """The exchange failed (connection, framing, bounds); ``status`` is the HTTP status, 0 if none."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Response:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body


class Getter:
    """GETs on one server (``https://host:port``), with ``headers`` on every request."""

    def __init__(
        self,
        server: str,
        tls: ssl.SSLContext | None,
        headers: Mapping[str, str],
        server_hostname: str | None = None,
    ) -> None:
        parts = urlsplit(server)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"not an http(s) server: {server!r}")
        self._host, self._port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = tls if parts.scheme == "https" else None
        self._server_hostname = (server_hostname or self._host) if self._tls else None
        host = f"[{self._host}]" if ":" in self._host else self._host
        fixed = {"Host": f"{host}:{self._port}", "Accept": "application/json", **headers}
        self._head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, path: str, timeout: float) -> Response:
        """One GET; a kept connection the server closed meanwhile is tried once more, fresh."""
        if not path.startswith("/") or any(c in path for c in " \r\n"):
            raise ValueError(f"not a request path: {path!r}")
        async with asyncio.timeout(timeout):
            while self._idle:
                connection = self._idle.pop()
                try:
                    return await self._exchange(connection, path)
                except (HttpError, OSError, asyncio.IncompleteReadError):
                    connection[1].close()  # stale: the server ended it while idle
                except BaseException:
                    connection[1].close()
                    raise
            connection = await asyncio.open_connection(
                self._host,
                self._port,
                ssl=self._tls,
                server_hostname=self._server_hostname,
                limit=MAX_HEAD_BYTES,
            )
            try:
                return await self._exchange(connection, path)
            except BaseException as exc:
                connection[1].close()
                if isinstance(exc, asyncio.IncompleteReadError):
                    raise HttpError(f"GET {path}: the connection closed mid-answer") from exc
                raise

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()

    async def _exchange(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], path: str
    ) -> Response:
        reader, writer = connection
        writer.write(f"GET {path} HTTP/1.1\r\n{self._head}\r\n".encode())
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise HttpError(f"GET {path}: an answer's head over {MAX_HEAD_BYTES} bytes") from None
        status, headers = _head(head, path)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _chunked(reader, path)
        elif (length := headers.get("content-length", "")).isdigit() and int(length) <= MAX_BODY_BYTES:
            body = await reader.readexactly(int(length))
        else:
            raise HttpError(f"GET {path}: an answer without a length, or over {MAX_BODY_BYTES} bytes", status)
        if headers.get("connection", "").lower() != "close" and len(self._idle) < IDLE_CONNECTIONS:
            self._idle.append(connection)
        else:
            writer.close()
        return Response(status, body)


def _head(head: bytes, path: str) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise HttpError(f"GET {path}: not an HTTP/1.1 answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return int(code), headers


async def _chunked(reader: asyncio.StreamReader, path: str) -> bytes:
    body = bytearray()
    while True:
        try:
            size_line = (await reader.readuntil(b"\r\n"))[:-2].split(b";")[0].strip()
        except asyncio.LimitOverrunError:
            raise HttpError(f"GET {path}: a chunk's size line over {MAX_HEAD_BYTES} bytes") from None
        try:
            size = int(size_line, 16)
        except ValueError:
            raise HttpError(f"GET {path}: a chunk size {size_line[:20]!r}") from None
        if size == 0:
            for _ in range(64):  # trailers, if any, then the blank line
                if await reader.readuntil(b"\r\n") == b"\r\n":
                    return bytes(body)
            raise HttpError(f"GET {path}: an answer with more than 64 trailers")
        if len(body) + size > MAX_BODY_BYTES:
            raise HttpError(f"GET {path}: an answer over {MAX_BODY_BYTES} bytes")
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise HttpError(f"GET {path}: a chunk not ended by CRLF")

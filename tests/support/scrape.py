"""Talking to a running OpsServer over real HTTP, and reading its metrics."""

from __future__ import annotations

import asyncio
import http.client
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from shim.bootstrap import Shim
from shim.ops.http import OpsServer


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


class _Serving(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


S = TypeVar("S", bound=_Serving)


@asynccontextmanager
async def started(server: S) -> AsyncIterator[S]:
    """An OpsServer (or OpsThread) serving for the block."""
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def ops_for(shim: Shim) -> AbstractAsyncContextManager[OpsServer]:
    """An OpsServer on a free local port answering from ``shim``."""
    return started(OpsServer("127.0.0.1", 0, ready=shim.ready, status=shim.status))


async def request(port: int, path: str, method: str = "GET", host: str = "127.0.0.1") -> Reply:
    def send() -> Reply:
        connection = http.client.HTTPConnection(host, port, timeout=5)
        try:
            connection.request(method, path)
            response = connection.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            connection.close()

    return await asyncio.to_thread(send)


async def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` as is; everything the server answers before it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(5):
            return await reader.read()
    finally:
        writer.close()


Labels = frozenset[tuple[str, str]]


class Samples:
    """One scrape: every sample by name and labels."""

    def __init__(self, text: str) -> None:
        self.values: dict[tuple[str, Labels], float] = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def get(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels; 0 when there is none."""
        return self.values.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum over every sample carrying at least these labels."""
        wanted = set(labels.items())
        return sum(v for (n, have), v in self.values.items() if n == name and wanted <= have)

    def since(self, before: Samples, name: str, **labels: str) -> float:
        """How much the sample grew from the scrape ``before``."""
        return self.get(name, **labels) - before.get(name, **labels)

    def has(self, name: str, **labels: str) -> bool:
        wanted = set(labels.items())
        return any(n == name and wanted <= have for n, have in self.values)


async def scrape(port: int) -> Samples:
    reply = await request(port, "/metrics")
    assert reply.status == 200, reply
    return Samples(reply.body.decode())


async def scrape_until(port: int, done: Callable[[Samples], bool], timeout: float = 15.0) -> Samples:
    """Scrape until ``done`` holds (what the shim reports may lag the event that changes it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        samples = await scrape(port)
        if done(samples) or asyncio.get_running_loop().time() > deadline:
            return samples
        await asyncio.sleep(0.05)

"""The DRA publisher's API client against a server that never answers: every call ends, with
ApiError, within its time bound (a real TCP socket; the bound shortened for the test)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shim.dra import kube
from shim.dra.kube import ApiError, ApiServer

VERSION = json.dumps({"major": "1", "minor": "37", "gitVersion": "v1.37.2"}).encode()


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer_version: bool) -> None:
    """Reads requests; answers GET /version if told to, and nothing else, ever."""
    try:
        while line := await reader.readline():
            if answer_version and line.startswith(b"GET /version"):
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                head += f"Content-Length: {len(VERSION)}\r\n\r\n"
                writer.write(head.encode() + VERSION)
                await writer.drain()
    except ConnectionError:
        pass


async def _kubeconfig(tmp_path: Path, answer_version: bool) -> AsyncIterator[Path]:
    server = await asyncio.start_server(lambda r, w: _silent(r, w, answer_version), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    async with server:
        yield path
        server.close()


@pytest.fixture(autouse=True)
def short_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT_S", 0.5)


async def test_connecting_to_a_server_that_never_answers_fails_within_the_bound(tmp_path: Path) -> None:
    async for kubeconfig in _kubeconfig(tmp_path, answer_version=False):
        async with asyncio.timeout(10):
            with pytest.raises(ApiError, match="did not answer within 0.5 s"):
                await ApiServer.connect(kubeconfig)


async def test_a_call_the_server_never_answers_fails_within_the_bound(tmp_path: Path) -> None:
    async for kubeconfig in _kubeconfig(tmp_path, answer_version=True):
        api = await ApiServer.connect(kubeconfig)
        async with asyncio.timeout(10):
            with pytest.raises(ApiError, match="GET /apis/resource.k8s.io"):
                await api.slice_versions()

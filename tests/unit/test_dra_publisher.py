"""The DRA publisher's view of its slices (issue 42, items 2 and 7c), against an API server in
memory whose replies and watch events can be made to race the way a busy node sees them."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shim.dra import publisher as publisher_module
from shim.dra.kube import ApiError, ApiServer
from shim.dra.ownership import Offer
from shim.dra.publisher import PoolPublisher
from shim.dra.slices import PoolDevice
from shim.model import Device
from tests.support.memory_api import MemoryApi
from tests.support.waiting import until

DRIVER, NODE = "gpu.example.com", "node-a"
OFFER = Offer([PoolDevice("gpu-0", Device("gpu-0"))])


def generations(api: MemoryApi) -> list[int]:
    return [s["spec"]["pool"]["generation"] for s in api.slices.values()]


@asynccontextmanager
async def publishing(api: MemoryApi) -> AsyncIterator[PoolPublisher]:
    async def connect(kubeconfig: Path | None) -> MemoryApi:
        return api

    publisher = PoolPublisher(DRIVER, NODE, lambda: OFFER, connect=connect)
    task = asyncio.create_task(publisher.run())
    try:
        yield publisher
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_reply_read_after_the_watch_delivered_its_slices_deletion_does_not_bring_it_back() -> None:
    """The reply to a create comes in after the watch's DELETED of that very slice (a busy node):
    the deletion, the later resourceVersion, wins, and the pool is published again."""
    api = MemoryApi()

    async def deleted_first(created: dict[str, Any]) -> None:
        api.before_reply = None
        gone = api.delete_all()
        await until(lambda: api.delivered >= gone, "the watch has taken in the deletion")

    api.before_reply = deleted_first
    async with publishing(api) as publisher:
        await until(lambda: generations(api) == [2], "the deleted slice is published again")
        assert publisher.status.last_error is None


async def test_a_watch_that_ends_is_followed_by_a_fresh_list_that_puts_a_wrong_view_right(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deletion the watch never delivered (whatever the cause) is found by the list that
    follows the end of the watch, at once and without an error."""
    monkeypatch.setattr(publisher_module, "SHORTEST_WATCH_S", 0.0)
    api = MemoryApi()
    async with publishing(api) as publisher:
        await until(lambda: generations(api) == [1], "the pool is published")
        api.slices.clear()  # no event: the view is now wrong
        api.end_watches()
        await until(lambda: generations(api) == [2], "the pool is published again")
        assert api.lists == 2
        assert publisher.status.last_error is None


async def test_410_gone_lists_again_without_an_error() -> None:
    api = MemoryApi()
    async with publishing(api) as publisher:
        await until(lambda: generations(api) == [1], "the pool is published")
        api.slices.clear()
        api.end_watches(ApiError("watch: too old resource version", 410))
        await until(lambda: generations(api) == [2], "the pool is published again")
        assert api.lists == 2
        assert publisher.status.last_error is None


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port of 127.0.0.1 nothing listens on (bound, never listening, for the test)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


async def test_an_api_server_nothing_answers_at_is_named_as_such_not_as_credentials(
    tmp_path: Path, closed_port: int
) -> None:
    """Issue 42, 7c: the credentials are fine; the log and last_error say the connection was
    refused, and where."""
    config = kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{closed_port}")
    said = f"cannot reach the API server at https://127.0.0.1:{closed_port}: connection refused"
    with pytest.raises(ApiError) as raised:
        await ApiServer.connect(config)
    assert str(raised.value) == said
    publisher = PoolPublisher(DRIVER, NODE, lambda: OFFER, kubeconfig=config)
    task = asyncio.create_task(publisher.run())
    try:
        await until(lambda: publisher.status.last_error is not None, "the publisher's first failure")
    finally:
        task.cancel()
    assert publisher.status.last_error == said


async def test_credentials_that_cannot_be_read_are_named_as_such(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("{not: [yaml")
    with pytest.raises(ApiError, match="^cannot load Kubernetes credentials: "):
        await ApiServer.connect(broken)

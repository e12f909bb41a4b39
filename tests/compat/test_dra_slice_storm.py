"""DRA publishing under a storm of deletions (issue 42, item 2): the node's slices deleted as each
new generation appears, as a kubelet restart or a plugin deregistration does, against a real
kube-apiserver and etcd (tests/support/control_plane.py), the publisher running in this process.

Every deletion must be published again within REPUBLISH_S, none lost. Some create replies are
read late (SLOW_EVERY, SLOW_REPLY_S), as on a busy node: by then the watch has delivered the
slice's deletion, and a publisher that records a reply without ordering it by resourceVersion
brings the deleted slice back into its view and never publishes it again.

STORM deletions by default; DEVSHIM_SLICE_STORM=1000 (or more) runs a longer storm by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases as upstream
from shim.dra.kube import ApiServer
from shim.dra.ownership import Offer
from shim.dra.publisher import PoolPublisher
from shim.dra.slices import PoolDevice
from shim.model import Device
from tests.support import control_plane
from tests.support.dra import GPU_DRIVER

STORM = int(os.environ.get("DEVSHIM_SLICE_STORM", "60"))
REPUBLISH_S = 2.0  # from a deletion's reply to the next generation's slice seen by a watch
SLOW_EVERY, SLOW_REPLY_S = 8, 0.25  # one create reply in SLOW_EVERY is read this late

RELEASES = [control_plane.param(r, control_plane.BOTH_ENDS) for r in control_plane.APISERVERS]


@pytest.fixture(scope="module", params=RELEASES)
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    release: upstream.Release = request.param
    with control_plane.running(release) as running:
        yield running


class LateReplies:
    """An ApiServer whose every SLOW_EVERY-th create reply reaches the publisher SLOW_REPLY_S late."""

    def __init__(self, api: ApiServer) -> None:
        self._api = api
        self.creates = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    async def create_slice(self, version: str, body: dict[str, Any]) -> dict[str, Any]:
        created = await self._api.create_slice(version, body)
        self.creates += 1
        if self.creates % SLOW_EVERY == 0:
            await asyncio.sleep(SLOW_REPLY_S)  # the reply, not the write, is late
        return created


async def _new_generations(
    api: ApiServer, version: str, selector: str
) -> AsyncGenerator[dict[str, Any], None]:
    """Each slice of a generation newer than any before, as a watch delivers it."""
    _, since = await api.list_slices(version, selector)
    newest = 0
    while True:  # a watch the API server ends is started again where it stopped
        # Closed with this generator: its response is not left for the garbage collector.
        async with contextlib.aclosing(api.watch_slices(version, selector, since)) as events:
            async for kind, obj in events:
                since = obj.get("metadata", {}).get("resourceVersion", since)
                generation = obj.get("spec", {}).get("pool", {}).get("generation", 0)
                if kind in ("ADDED", "MODIFIED") and generation > newest:
                    newest = generation
                    yield obj


@pytest.mark.timeout(60 + STORM * REPUBLISH_S / 4)  # ~0.1 s a deletion: room for a slow machine
async def test_every_slice_deleted_as_its_generation_appears_is_published_again(
    plane: ControlPlane, tmp_path: Path
) -> None:
    node = "node-storm"
    version = control_plane.NEWEST_DRA[plane.minor]
    selector = f"spec.driver={GPU_DRIVER},spec.nodeName={node}"
    offer = Offer([PoolDevice(f"gpu-{i}", Device(f"gpu-{i}")) for i in range(4)])
    late: list[LateReplies] = []

    async def connect(kubeconfig: Path | None) -> LateReplies:
        late.append(LateReplies(await ApiServer.connect(kubeconfig)))
        return late[-1]

    publisher = PoolPublisher(
        GPU_DRIVER, node, lambda: offer, kubeconfig=plane.admin_kubeconfig, connect=connect
    )
    client = await ApiServer.connect(plane.admin_kubeconfig)
    appearing = _new_generations(client, version, selector)
    publishing = asyncio.create_task(publisher.run())
    times: list[float] = []
    try:
        async with asyncio.timeout(30):
            current = await anext(appearing)
        for deletion in range(STORM):
            await client.delete_slice(version, current["metadata"]["name"], current["metadata"]["uid"])
            deleted = time.monotonic()
            try:
                async with asyncio.timeout(REPUBLISH_S):
                    current = await anext(appearing)
            except TimeoutError:
                raise AssertionError(
                    f"deletion {deletion + 1} of {STORM} was not published again within {REPUBLISH_S} s; "
                    f"the publisher's status: {publisher.status}"
                ) from None
            times.append(time.monotonic() - deleted)
    finally:
        publishing.cancel()
        await asyncio.gather(publishing, return_exceptions=True)
        await appearing.aclose()
    assert current["spec"]["pool"]["generation"] == STORM + 1
    assert sum(r.creates for r in late) >= STORM // SLOW_EVERY * SLOW_EVERY  # the late replies ran
    assert publisher.status.last_error is None
    slowest, mean = max(times), sum(times) / len(times)
    print(f"{STORM} deletions, each published again; slowest {slowest:.3f} s, mean {mean:.3f} s")

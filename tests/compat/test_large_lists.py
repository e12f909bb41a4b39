"""Device lists near the kubelet's 4 MiB gRPC message limit, seen from the fake kubelet.

The kubelet dials plugins with gRPC's default receive limit (client.go dial), as the fake kubelet
does (its channel sets no max_receive_message_length): a list over it must be a clear error from
devshim, not a stream that fails on the kubelet's side and a plugin re-registering into it.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from pathlib import Path

import pytest

from shim.compat.fakekubelet import FakeKubelet
from shim.deviceplugin.common import KUBELET_MAX_MESSAGE_BYTES
from shim.ops.series import REGISTRY
from shim.status import render_status
from tests.support.shim_fixtures import logged, running_shim

GPU = "example.com/biggpu"
EXACT = "example.com/exact"
OVER = "example.com/over"
LIMIT = f"{KUBELET_MAX_MESSAGE_BYTES:,}"  # as devshim's message writes it


def refused_lists(resource: str) -> float:
    return REGISTRY.get_sample_value("devshim_list_too_large_total", {"resource": resource}) or 0.0


def registrations(kubelet: FakeKubelet, resource: str) -> int:
    return sum(1 for r in kubelet.registrations if r.resource_name == resource)


async def test_50000_realistic_devices_fit_in_one_list(plugin_dir: Path, kubelet: FakeKubelet) -> None:
    """The issue's goal: 50,000 GPUs named like NVIDIA's ("GPU-<uuid>"), one NUMA node each,
    reach the kubelet as one list (about 2.9 MB: some 72,000 such devices fit)."""
    rng = random.Random(11)
    ids = [f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}" for _ in range(50_000)]
    devices = [{"id": i, "numa_nodes": [n % 2]} for n, i in enumerate(ids)]
    before = refused_lists(GPU)
    async with running_shim(plugin_dir, {GPU: {"devices": devices}}):
        session = await kubelet.wait_for_plugin(GPU, timeout=30)
        listed = await session.wait_for_list(timeout=30)
        assert len(listed) == 50_000
        assert [d.id for d in listed] == ids
        assert listed[-1].numa_nodes == (1,)
        assert not session.stream_ended.is_set()
    assert refused_lists(GPU) == before


def ids_totalling(size: int) -> list[str]:
    """Device IDs whose Healthy, topology-less list encodes to exactly ``size`` bytes: 13 bytes
    of framing per device (entry tag and length, ID tag and length, health field) plus its ID."""
    long_ids, rest = divmod(size, 13 + 63)
    return [f"{n:063d}" for n in range(long_ids)] + ["e" * (rest - 13)]


async def test_the_limit_is_the_kubelets_exactly(plugin_dir: Path, kubelet: FakeKubelet) -> None:
    """A list of exactly 4 MiB reaches a kubelet with gRPC's default limit (which counts the
    message, not the 5-byte frame prefix); one byte more is refused by devshim, not the kubelet."""
    exact, over = ids_totalling(KUBELET_MAX_MESSAGE_BYTES), ids_totalling(KUBELET_MAX_MESSAGE_BYTES + 1)
    resources = {EXACT: {"devices": [{"id": i} for i in exact]}, OVER: {"devices": [{"id": i} for i in over]}}
    before = refused_lists(OVER)
    # Over 110,000 static devices: more than max_devices' default allows in all.
    async with running_shim(plugin_dir, resources, max_devices=120_000):
        fits = await kubelet.wait_for_plugin(EXACT, timeout=30)
        assert len(await fits.wait_for_list(timeout=30)) == len(exact)
        refused = await kubelet.wait_for_plugin(OVER, timeout=30)
        async with asyncio.timeout(30):
            await refused.stream_ended.wait()
        # devshim's status, not the kubelet's own "Received message larger than max".
        assert refused.stream_error == (
            f"RESOURCE_EXHAUSTED: {OVER}: ListAndWatch: the list of {len(over)} devices is "
            f"{KUBELET_MAX_MESSAGE_BYTES + 1:,} bytes, over the kubelet's {LIMIT}-byte gRPC "
            "message limit; not sent"
        )
        assert refused.lists == []
        assert refused_lists(OVER) == before + 1


@pytest.mark.parametrize("registration", ["classic", "watcher"])
async def test_a_list_over_the_limit_is_refused_once_and_sent_when_it_shrinks(
    plugin_dir: Path, state_dir: Path, registration: str
) -> None:
    """100,000 devices with 40-character ID prefixes (5.8 MB): the kubelet's stream ends with
    RESOURCE_EXHAUSTED naming the resource, counted, logged and shown in status; devshim does not
    register again until the list changes (classic: no Register; watcher: no socket to find);
    shrunk to 50,000, the list reaches the kubelet. A static source: a driver may not list more
    than 50,000 devices (shim/driverhost/limits.py), which with IDs this long fit the kubelet."""
    prefix = "node-17.rack-4.example.com-accelerator-x"  # 40 characters, the longest id_prefix
    size = f"{sum(13 + len(f'{prefix}{n}') for n in range(100_000)):,} bytes"  # as in ids_totalling
    before = refused_lists(GPU)
    registry = state_dir / "plugins_registry"  # used by the watcher path only
    watching = registry if registration == "watcher" else None
    with logged("ERROR") as errors:
        resources = {GPU: {"count": 100_000, "id_prefix": prefix}}
        async with (
            FakeKubelet(plugin_dir, plugins_registry=watching) as kubelet,
            running_shim(plugin_dir, resources, registration=registration, plugins_registry_dir=registry) as (
                shim,
                sources,
            ),
        ):
            first = await kubelet.wait_for_plugin(GPU, timeout=30)
            async with asyncio.timeout(30):
                await first.stream_ended.wait()
            assert first.lists == []
            assert first.stream_error is not None
            assert first.stream_error.startswith(f"RESOURCE_EXHAUSTED: {GPU}: ListAndWatch: ")
            assert f"of 100000 devices is {size}, over the kubelet's {LIMIT}-byte" in first.stream_error
            assert refused_lists(GPU) == before + 1
            assert any(GPU in e and size in e for e in errors)

            # No re-registration into the same failure: the endpoint waits for another list.
            await asyncio.sleep(2)
            assert registrations(kubelet, GPU) == 1
            assert refused_lists(GPU) == before + 1
            status = shim.status()["resources"][GPU]
            assert status["registered"] is False
            assert size in status["last_error"]
            assert "last error: " + status["last_error"] in render_status(shim.status())

            shrunk_at = time.monotonic()
            await sources[GPU].set_devices((await sources[GPU].list_devices())[:50_000])
            await kubelet.wait_for_registration(GPU, count=2, timeout=15)
            second = kubelet.plugin(GPU)
            listed = await second.wait_for_list(timeout=15)
            assert len(listed) == 50_000 and listed[-1].id == f"{prefix}49999"
            assert time.monotonic() - shrunk_at < 10
            assert not second.stream_ended.is_set()
            assert registrations(kubelet, GPU) == 2
            assert refused_lists(GPU) == before + 1
            status = shim.status()["resources"][GPU]
            assert status["registered"] is True and status["last_error"] is None

"""Deallocate for drivers on v1beta1, emulated from the kubelet's PodResources List."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.compat.fakekubelet.records import ContainerSpec
from shim.settings import Settings
from tests.support import DRIVERS
from tests.support.unix import short_temp_dir

DRIVER = DRIVERS / "recording.py"
RESOURCE = "example.com/rec"
# The recording driver as configured: its one resource, and the env its grants set.
REC = {
    "name": "rec",
    "user": "root",
    "command": [sys.executable, str(DRIVER)],
    "resources": [RESOURCE],
    "policy": {"envs": ["REC"]},
}
GRACE_S = 0.6
POLL_S = 0.05


@dataclass
class Deallocations:
    """The driver's `deallocated ...` log lines, as they reach devshim's log."""

    calls: list[tuple[float, str]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def sink(self, message: Any) -> None:
        text = message.record["message"]
        if "deallocated " in text:
            self.calls.append((time.monotonic(), text.rsplit("deallocated ", 1)[1]))
            self.arrived.set()

    async def next(self, timeout: float = 10) -> str:
        async with asyncio.timeout(timeout):
            await self.arrived.wait()
        self.arrived.clear()
        return self.calls[-1][1]


@pytest.fixture
def pod_resources_dir() -> Iterator[Path]:
    with short_temp_dir("ds-pr-") as path:
        yield path


@asynccontextmanager
async def running(
    plugin_dir: Path, state_dir: Path, pod_resources: Path, *, rate: tuple[float, int] | None = (100.0, 10)
) -> AsyncIterator[tuple[FakeKubelet, Shim, Deallocations]]:
    socket = pod_resources / "kubelet.sock"
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        drivers=[REC],
        deallocation={"pod_resources_socket": str(socket), "poll_interval_s": POLL_S, "grace_s": GRACE_S},
    )
    seen = Deallocations()
    sink = logger.add(seen.sink, level="INFO")
    try:
        kubelet = FakeKubelet(plugin_dir, pod_resources_socket=socket, pod_resources_rate=rate)
        async with kubelet, Shim(settings) as shim:
            await (await kubelet.wait_for_plugin(RESOURCE, timeout=20)).wait_for_list()
            yield kubelet, shim, seen
    finally:
        logger.remove(sink)


async def test_a_finished_pod_gets_its_devices_deallocated_once_after_the_grace_period(
    plugin_dir: Path, state_dir: Path, pod_resources_dir: Path
) -> None:
    """While the pod runs nothing is released; after it ends the driver gets deallocate for
    exactly its devices, no sooner than the grace period, and only once."""
    async with running(plugin_dir, state_dir, pod_resources_dir) as (kubelet, shim, seen):
        given = await kubelet.run_pod("default", "p1", [ContainerSpec("app", RESOURCE, 2)])
        await asyncio.sleep(GRACE_S * 2)  # the pod runs for a while: nothing may be released
        assert seen.calls == []
        ended = time.monotonic()
        await kubelet.end_pod("default", "p1")
        assert await seen.next() == ",".join(given["app"])
        assert seen.calls[0][0] - ended >= GRACE_S
        await asyncio.sleep(GRACE_S * 2)
        assert len(seen.calls) == 1
        assert shim.deallocation.status == "on"


async def test_an_app_container_reusing_init_devices_gets_no_premature_deallocate(
    plugin_dir: Path, state_dir: Path, pod_resources_dir: Path
) -> None:
    """The init container's devices never appear in List and are given again to the app
    container: nothing is released while the pod runs, then one deallocate for the app's."""
    async with running(plugin_dir, state_dir, pod_resources_dir) as (kubelet, _, seen):
        given = await kubelet.run_pod(
            "default",
            "p2",
            [ContainerSpec("init", RESOURCE, 2, init=True), ContainerSpec("app", RESOURCE, 2)],
        )
        assert given["app"] == given["init"]
        await asyncio.sleep(GRACE_S * 3)
        assert seen.calls == []
        await kubelet.end_pod("default", "p2")
        assert await seen.next() == ",".join(given["app"])
        await asyncio.sleep(GRACE_S * 2)
        assert len(seen.calls) == 1


async def test_a_rate_limiting_kubelet_is_polled_more_slowly(
    plugin_dir: Path, state_dir: Path, pod_resources_dir: Path
) -> None:
    """With the kubelet allowing 2 calls a second, devshim backs off instead of storming it,
    and still releases a finished pod's devices."""
    async with running(plugin_dir, state_dir, pod_resources_dir, rate=(2.0, 1)) as (kubelet, _, seen):
        await kubelet.run_pod("default", "p3", [ContainerSpec("app", RESOURCE, 1)])
        before = kubelet.pod_resources_calls
        await asyncio.sleep(2.0)
        # Unthrottled, polling every 50 ms would be about 40 calls in 2 s.
        assert kubelet.pod_resources_calls - before <= 12
        await kubelet.end_pod("default", "p3")
        await seen.next(timeout=20)


async def test_without_a_pod_resources_socket_the_emulation_is_off_and_says_so(
    plugin_dir: Path, state_dir: Path, pod_resources_dir: Path, warnings: list[str], kubelet: FakeKubelet
) -> None:
    """No PodResources service (feature off, old kubelet): status says off, one warning."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        drivers=[REC],
        deallocation={
            "pod_resources_socket": str(pod_resources_dir / "absent.sock"),
            "poll_interval_s": POLL_S,
        },
    )
    async with Shim(settings) as shim:
        await kubelet.wait_for_plugin(RESOURCE, timeout=20)
        # The emulator polls once at start, before the driver is even up; status has no
        # event of its own, so look a few times within a bound.
        for _ in range(100):
            if shim.deallocation.status.startswith("off"):
                break
            await asyncio.sleep(0.05)
    assert "no PodResources socket" in shim.deallocation.status
    assert sum("deallocate emulation is off" in w for w in warnings) == 1


async def test_a_driver_added_by_reload_to_a_static_only_config_gets_the_emulation(
    plugin_dir: Path, state_dir: Path, pod_resources_dir: Path, kubelet: FakeKubelet
) -> None:
    """Static devices need no release, so a static-only devshim runs no emulation; a reload that
    adds a driver starts it (it used to start only with devshim)."""
    common: dict[str, Any] = {
        "device_plugins_dir": plugin_dir,
        "state_dir": state_dir,
        "resources": [{"name": "example.com/static", "static": {"count": 1}}],
        "deallocation": {
            "pod_resources_socket": str(pod_resources_dir / "absent.sock"),
            "poll_interval_s": POLL_S,
        },
    }
    async with Shim(Settings.load(**common)) as shim:
        assert shim.deallocation.status.startswith("not running: no drivers to tell")
        await shim.reload(Settings.load(**common, drivers=[REC]))
        await kubelet.wait_for_plugin(RESOURCE, timeout=20)
        async with asyncio.timeout(10):  # the emulation's first poll finds no socket: off, says why
            while not shim.deallocation.status.startswith("off"):
                await asyncio.sleep(0.02)

"""The compatibility matrix run: devshim offering v1beta1 and v1beta2, a lifecycle driver, and
the fake kubelet speaking v1beta1, v1beta2 or both by either registration path (matrix.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from shim.bootstrap import Shim
from shim.settings import Settings
from tests.compat.kubelet import CleanupMode, FakeKubelet, PluginSession
from tests.compat.kubelet.records import ContainerSpec
from tests.compat.matrix import KUBELETS, ORDER, Cell, negotiated, params

DRIVER = Path(__file__).with_name("drivers") / "lifecycle.py"
RESOURCE = "example.com/life"
IDS = ["l-0", "l-1", "l-2", "l-3"]
GRACE_S = 0.3


@dataclass
class Calls:
    """The driver's optional calls, from its log notifications."""

    seen: list[str] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def sink(self, message: Any) -> None:
        text = message.record["message"]
        if "call " in text:
            self.seen.append(text.split("call ", 1)[1])
            self.arrived.set()

    async def wait_for(self, call: str, timeout: float = 10) -> None:
        while call not in self.seen:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), timeout)


@dataclass
class World:
    kubelet: FakeKubelet
    shim: Shim
    calls: Calls
    session: PluginSession

    def driver_pid(self) -> int:
        process = self.shim.drivers[0].process
        assert process is not None
        return process.pid


@pytest.fixture
def side_dirs() -> Iterator[tuple[Path, Path]]:
    registry = Path(tempfile.mkdtemp(prefix="ds-reg-", dir="/tmp"))
    pods = Path(tempfile.mkdtemp(prefix="ds-pr-", dir="/tmp"))
    yield registry, pods
    shutil.rmtree(registry, ignore_errors=True)
    shutil.rmtree(pods, ignore_errors=True)


@asynccontextmanager
async def world(
    cell: Cell, plugin_dir: Path, state_dir: Path, side_dirs: tuple[Path, Path], versions: tuple[str, ...]
) -> AsyncIterator[World]:
    registry, pods = side_dirs
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        api_versions=["v1beta1", "v1beta2"],
        registration=cell.registration,
        plugins_registry_dir=registry,
        drivers=[{"name": "life", "command": [sys.executable, str(DRIVER)]}],
        deallocation={
            "pod_resources_socket": str(pods / "kubelet.sock"),
            "poll_interval_s": 0.05,
            "grace_s": GRACE_S,
        },
    )
    calls = Calls()
    sink = logger.add(calls.sink, level="INFO")
    kubelet = FakeKubelet(
        plugin_dir,
        versions=versions,
        pod_resources_socket=pods / "kubelet.sock",
        plugins_registry=registry if cell.registration == "watcher" else None,
    )
    try:
        async with kubelet, Shim(settings) as shim:
            session = await kubelet.wait_for_plugin(RESOURCE, timeout=30)
            await session.wait_for_list(lambda ds: len(ds) == 4, timeout=30)
            yield World(kubelet, shim, calls, session)
    finally:
        logger.remove(sink)


def all_listed(devices: tuple[Any, ...]) -> bool:
    return [d.id for d in devices] == IDS


@pytest.mark.parametrize("cell", params())
async def test_matrix_cell(
    cell: Cell, plugin_dir: Path, state_dir: Path, side_dirs: tuple[Path, Path]
) -> None:
    """One cell: the scenario's kubelet-visible outcome with this kubelet and registration path."""
    if reason := cell.skip_reason():
        pytest.skip(reason)
    start = KUBELETS[cell.kubelet]
    if cell.scenario == "downgrade":
        start = KUBELETS[ORDER[ORDER.index(cell.kubelet) + 1]]
    async with world(cell, plugin_dir, state_dir, side_dirs, start) as w:
        await SCENARIO[cell.scenario](cell, w)


async def register(cell: Cell, w: World) -> None:
    record = await w.kubelet.wait_for_registration(RESOURCE)
    assert record.ok, record.error
    assert record.version == negotiated(KUBELETS[cell.kubelet]) == w.session.version
    assert record.path == cell.registration
    if cell.registration == "classic":
        assert w.shim.served[RESOURCE].endpoint.negotiated == record.version


async def list_watch(cell: Cell, w: World) -> None:
    listed = await w.session.wait_for_list()
    assert [(d.id, d.health, d.numa_nodes) for d in listed] == [
        (i, "Healthy", (n % 2,)) for n, i in enumerate(IDS)
    ]


async def health_change(cell: Cell, w: World) -> None:
    os.kill(w.driver_pid(), signal.SIGUSR1)
    listed = await w.session.wait_for_list(lambda ds: not ds[3].healthy)
    assert all_listed(listed) and [d.healthy for d in listed] == [True, True, True, False]


async def allocate(cell: Cell, w: World) -> None:
    assert (await w.session.allocate(["l-1", "l-2"])).envs == {"LIFE": "l-1,l-2"}


async def preferred_allocation(cell: Cell, w: World) -> None:
    assert await w.session.preferred_allocation(["l-0", "l-1", "l-2"], ["l-2"], 2) == ["l-2", "l-0"]


async def prestart(cell: Cell, w: World) -> None:
    assert w.session.options.pre_start_required
    await w.session.prestart(["l-0"])
    await w.calls.wait_for("prestart l-0")


async def deallocate(cell: Cell, w: World) -> None:
    """v1beta2: the kubelet's Deallocate; v1beta1: emulated from PodResources. Once either way."""
    given = await w.kubelet.run_pod("default", "p", [ContainerSpec("app", RESOURCE, 2)])
    await w.kubelet.end_pod("default", "p")
    expected = "deallocate " + ",".join(sorted(given["app"]))
    await w.calls.wait_for(expected)
    await asyncio.sleep(GRACE_S * 3)  # time for a second, wrong, deallocate to show up
    assert w.calls.seen.count(expected) == 1


async def post_stop(cell: Cell, w: World) -> None:
    """v1beta2: PostStopContainer reaches the driver; v1beta1 has no such call, and none is made."""
    given = await w.kubelet.run_pod("default", "p", [ContainerSpec("app", RESOURCE, 1)])
    await w.kubelet.end_pod("default", "p")
    expected = "post_stop " + ",".join(given["app"])
    if w.session.version == "v1beta2":
        assert w.session.options.post_stop_container_required
        await w.calls.wait_for(expected)
    else:
        await w.calls.wait_for("deallocate " + ",".join(given["app"]))
        assert expected not in w.calls.seen


async def kubelet_restart(cell: Cell, w: World) -> None:
    await w.kubelet.restart(CleanupMode.KUBELET_1_33)
    await _registered_again(w, KUBELETS[cell.kubelet])


async def upgrade(cell: Cell, w: World) -> None:
    newer = KUBELETS[ORDER[ORDER.index(cell.kubelet) + 1]]
    await w.kubelet.restart(CleanupMode.KUBELET_1_25, versions=newer)
    await _registered_again(w, newer)


async def downgrade(cell: Cell, w: World) -> None:
    await w.kubelet.restart(CleanupMode.KUBELET_1_25, versions=KUBELETS[cell.kubelet])
    await _registered_again(w, KUBELETS[cell.kubelet])


async def _registered_again(w: World, versions: tuple[str, ...]) -> None:
    """Re-registered with the version the new kubelet speaks, every device there, same driver."""
    process = w.shim.drivers[0].process
    record = await w.kubelet.wait_for_registration(RESOURCE, count=2, timeout=30)
    assert record.ok and record.version == negotiated(versions)
    session = await w.kubelet.wait_for_plugin(RESOURCE)
    assert all_listed(await session.wait_for_list())
    assert all(all_listed(devices) for devices in session.lists)
    assert (await session.allocate(["l-3"])).envs == {"LIFE": "l-3"}
    assert w.shim.drivers[0].process is process, "the driver was restarted"


SCENARIO = {
    f.__name__: f
    for f in (register, list_watch, health_change, allocate, preferred_allocation, prestart, deallocate,
              post_stop, kubelet_restart, upgrade, downgrade)
}  # fmt: skip


@pytest.mark.parametrize("registration", ["classic", "watcher"])
async def test_a_restart_loop_across_upgrades_and_downgrades_loses_no_device(
    registration: str, plugin_dir: Path, state_dir: Path, side_dirs: tuple[Path, Path]
) -> None:
    """v1beta1 -> both -> v1beta2 -> both -> v1beta1, twice over: after each restart devshim is
    registered with the version the kubelet now speaks, every list received has every device,
    allocations keep working, and the driver is never restarted."""
    cell = Cell("v1beta1", registration, "upgrade")
    async with world(cell, plugin_dir, state_dir, side_dirs, KUBELETS["v1beta1"]) as w:
        process = w.shim.drivers[0].process
        steps = ["both", "v1beta2", "both", "v1beta1"] * 2
        for n, step in enumerate(steps, start=2):
            await w.kubelet.restart(CleanupMode.KUBELET_1_25, versions=KUBELETS[step])
            record = await w.kubelet.wait_for_registration(RESOURCE, count=n, timeout=30)
            assert record.ok and record.version == negotiated(KUBELETS[step]), (step, record)
            session = await w.kubelet.wait_for_plugin(RESOURCE)
            assert all_listed(await session.wait_for_list())
            assert all(all_listed(devices) for devices in session.lists), step
            assert (await session.allocate(["l-0"])).envs == {"LIFE": "l-0"}
        assert w.shim.drivers[0].process is process

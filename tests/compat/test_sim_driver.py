"""The simulated driver (adapters/sim) behind devshim, seen from the fake kubelet."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.settings import Settings
from tests.support.waiting import until

GPU = "example.com/tgpu"
NIC = "example.com/tnic"
EXTRA = "example.com/textra"  # added at run time
GRANT = {
    "envs": {"T": "{ids}"},
    "device_nodes": [{"container_path": "/dev/t-{id}", "host_path": "/dev/null"}],
}
# What GRANT holds, declared for the driver.
POLICY = {"envs": ["T"], "device_nodes": ["/dev/null"]}


@dataclass
class Running:
    kubelet: FakeKubelet
    shim: Shim
    control: Path

    def command(self, line: str) -> None:
        with self.control.open("a") as control:
            control.write(line + "\n")


@asynccontextmanager
async def start(
    plugin_dir: Path,
    state_dir: Path,
    resources: list[dict[str, Any]],
    registration: str = "classic",
    *,
    added: Sequence[str] = (),
    policy: dict[str, Any] | None = None,
    **timeouts: float,
) -> AsyncIterator[Running]:
    """The sim serving `resources` behind devshim, registered by `registration` with a fake kubelet,
    and allowed to serve those it may add at run time (`added`) and to grant what `policy` allows;
    `Running.command` writes its control file."""
    control = plugin_dir.parent / f"{plugin_dir.name}-control"
    control.touch()
    config = plugin_dir.parent / f"{plugin_dir.name}-sim.yaml"
    config.write_text(yaml.safe_dump({"resources": resources, "control_file": str(control)}))
    registry = state_dir / "plugins_registry"  # used by the watcher path only
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir / "state",
        registration=registration,
        plugins_registry_dir=registry,
        register_backoff_max_s=0.5,
        drivers=[
            {
                "name": "sim",
                "user": "root",
                "command": [sys.executable, "-m", "devshim_adapters.sim", "--config", str(config)],
                "resources": [*(r["name"] for r in resources), *added],
                "policy": policy or {},
                "timeouts": timeouts,
            }
        ],
    )
    try:
        watching = registry if registration == "watcher" else None
        async with FakeKubelet(plugin_dir, plugins_registry=watching) as kubelet, Shim(settings) as shim:
            yield Running(kubelet, shim, control)
    finally:
        control.unlink(missing_ok=True)
        config.unlink(missing_ok=True)


TWO_RESOURCES = [
    {
        "name": GPU,
        "devices": [
            {"id": "g-a", "numa_nodes": [0]},
            {"id": "g-b", "numa_nodes": [0]},
            {"id": "g-c", "numa_nodes": [1]},
        ],
        "grant": GRANT,
        "preferred_allocation": True,
        "prestart": True,
        "delays": {"preferred_allocation_s": 1.5},
    },
    {
        "name": NIC,
        "count": 2,
        "id_prefix": "n-",
        "grant_mode": "declared",
        "grant": GRANT,
        "delays": {"allocate_s": 5},
    },
]


@pytest.fixture
async def sim(plugin_dir: Path, state_dir: Path) -> AsyncIterator[Running]:
    async with start(plugin_dir, state_dir, TWO_RESOURCES, added=[EXTRA], policy=POLICY) as running:
        yield running


async def session(running: Running, resource: str) -> PluginSession:
    found = await running.kubelet.wait_for_plugin(resource, timeout=20)
    await found.wait_for_list()
    return found


async def test_one_driver_serves_two_resources_each_on_its_own_socket(sim: Running) -> None:
    """Both resources the sim declares are registered and listed with their own devices."""
    gpu, nic = await session(sim, GPU), await session(sim, NIC)
    assert [(d.id, d.numa_nodes) for d in gpu.latest] == [("g-a", (0,)), ("g-b", (0,)), ("g-c", (1,))]
    assert [d.id for d in nic.latest] == ["n-0", "n-1"]
    assert gpu.endpoint != nic.endpoint
    assert gpu.options.pre_start_required and gpu.options.get_preferred_allocation_available
    assert not nic.options.pre_start_required


async def test_per_call_allocate_returns_the_drivers_grant(sim: Running) -> None:
    """The sim expands its grant template for exactly the requested IDs."""
    grant = await (await session(sim, GPU)).allocate(["g-a", "g-c"])
    assert grant.envs == {"T": "g-a,g-c"}
    assert grant.device_nodes == (("/dev/t-g-a", "/dev/null", "rw"), ("/dev/t-g-c", "/dev/null", "rw"))


async def test_declared_grants_are_answered_without_asking_the_driver(sim: Running) -> None:
    """The sim would take 5 s to answer allocate for this resource; devshim answers from the
    grants declared at list time, merged per the protocol, well before that."""
    nic = await session(sim, NIC)
    start = time.perf_counter()
    grant = await nic.allocate(["n-0", "n-1"])
    assert time.perf_counter() - start < 2.5
    assert grant.envs == {"T": "n-0,n-1"}
    assert grant.device_nodes == (("/dev/t-n-0", "/dev/null", "rw"), ("/dev/t-n-1", "/dev/null", "rw"))


async def test_a_slow_preferred_allocation_does_not_stall_allocate(sim: Running) -> None:
    """While the sim spends 1.5 s on a preference, an Allocate sent after it finishes first."""
    gpu = await session(sim, GPU)
    order: list[str] = []

    async def prefer() -> None:
        assert await gpu.preferred_allocation(["g-a", "g-b", "g-c"], ["g-c"], 2) == ["g-c", "g-a"]
        order.append("preferred")

    async def allocate() -> None:
        await asyncio.sleep(0.2)
        await gpu.allocate(["g-b"])
        order.append("allocate")

    async with asyncio.timeout(15):
        await asyncio.gather(prefer(), allocate())
    assert order == ["allocate", "preferred"]


async def test_a_health_flip_in_the_driver_reaches_the_kubelet(sim: Running) -> None:
    """health_changed from the driver becomes a full list with that device Unhealthy, and
    Allocate of it is refused while the others still work."""
    gpu = await session(sim, GPU)
    sim.command(f"health {GPU} g-b Unhealthy")
    listed = await gpu.wait_for_list(lambda ds: not ds[1].healthy)
    assert [(d.id, d.health) for d in listed] == [
        ("g-a", "Healthy"),
        ("g-b", "Unhealthy"),
        ("g-c", "Healthy"),
    ]
    assert (await gpu.allocate(["g-a"])).envs == {"T": "g-a"}


async def test_a_resource_added_and_removed_at_run_time(sim: Running, plugin_dir: Path) -> None:
    """resources_changed adding a resource makes devshim list, serve and register it; removing
    it stops serving and removes its socket."""
    await session(sim, GPU)
    sim.command(f"add {EXTRA} 3")
    extra = await session(sim, EXTRA)
    assert [d.id for d in extra.latest] == ["textra-0", "textra-1", "textra-2"]
    socket = plugin_dir / extra.endpoint
    assert socket.exists()
    sim.command(f"remove {EXTRA}")
    async with asyncio.timeout(10):
        await extra.stream_ended.wait()
    # The stream ends before the socket is removed: wait for that too, however busy the machine.
    await until(lambda: not socket.exists(), f"{socket} is removed")


async def test_a_50000_device_list_reaches_the_kubelet_whole(plugin_dir: Path, state_dir: Path) -> None:
    """A large inventory crosses the pipe (megabytes on one line) and ListAndWatch intact."""
    async with start(plugin_dir, state_dir, [{"name": GPU, "count": 50_000, "id_prefix": "big-"}]) as running:
        gpu = await running.kubelet.wait_for_plugin(GPU, timeout=60)
        listed = await gpu.wait_for_list(timeout=60)
        assert len(listed) == 50_000
        assert listed[0].id == "big-0" and listed[-1].id == "big-49999"
        assert (await gpu.allocate(["big-49999"])).envs == {}


async def test_a_preference_past_its_deadline_is_dropped_without_restarting_the_driver(
    plugin_dir: Path, state_dir: Path
) -> None:
    """A driver slower than preferred_allocation's deadline gives no preference (the kubelet
    still gets a valid answer) and is not treated as hung: it keeps serving Allocate."""
    devices = [
        {"id": "p-0", "numa_nodes": [0]},
        {"id": "p-1", "numa_nodes": [1]},
        {"id": "p-2", "numa_nodes": [1]},
    ]
    slow = {"preferred_allocation_s": 3}
    resources = [{"name": GPU, "devices": devices, "preferred_allocation": True, "delays": slow}]
    async with start(plugin_dir, state_dir, resources, preferred_allocation_s=0.5) as running:
        gpu = await session(running, GPU)
        process = running.shim.drivers[0].process
        started = time.perf_counter()
        chosen = await gpu.preferred_allocation(["p-0", "p-1", "p-2"], ["p-2"], 2)
        # The sim would have chosen p-2 and p-1 (one NUMA node) after 3 s; devshim gave up
        # at 0.5 s and filled in order instead.
        assert chosen == ["p-2", "p-0"]
        assert time.perf_counter() - started < 2.5
        assert running.shim.drivers[0].process is process
        assert running.shim.drivers[0].status == "up"
        assert (await gpu.allocate(["p-1"])).envs == {}

"""One judged cell's world: devshim in front of the driver, and the real device manager as the
kubelet, both on one temp directory.

The harness of a release stands where the kubelet would (its kubelet.sock, its checkpoint, and
in watcher mode its plugin manager on plugins_registry); devshim is configured exactly as the
fake kubelet's cells configure it (driver_world.settings_for). A kubelet restart stops the
harness and starts one (of the same or another release) on the same directory, passing the
pods admitted so far and their containers as running, as a restarted kubelet would.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from shim.bootstrap import Shim
from shim.compat.driver_world import START_TIMEOUT_S, DevshimSide, DriverUnderTest, settings_for
from shim.compat.fakekubelet.records import HEALTHY
from shim.compat.results import Failed
from shim.facts import KUBELET_SOCKET

from .harness import Capacity, Harness, Pod, running_harness
from .releases import Release

POLL_S = 0.05
# The manager is observed by polling, not by a record of every list as the fake kubelet keeps:
# a crashed driver's outage must last long enough to be seen. 0.5 s was missed once on a busy
# CI machine (the restarted driver's list reached the manager 0.73 s after the crash, before a
# poll saw the outage); a record of the manager's lists in the harness would end the race.
DRIVER_RESTART_S = 2.0


class UpstreamKubelet:
    """The real device manager of one release at a time, on one device-plugins directory."""

    def __init__(self, binaries: Mapping[Release, Path], root: Path, watcher: bool) -> None:
        self.binaries = binaries
        self.plugin_dir = root / "device-plugins"
        self.watcher_dir = root / "plugins_registry" if watcher else None
        self.pod_resources = root / "pod-resources" / KUBELET_SOCKET
        self.logs = root
        self.pods: list[Pod] = []  # admitted so far; a restarted kubelet gets them back
        self.restarts = 0
        self._stack = AsyncExitStack()
        self._harness: Harness | None = None
        self._release: Release | None = None

    @property
    def harness(self) -> Harness:
        if self._harness is None:
            raise Failed("the upstream kubelet is not running")
        return self._harness

    @property
    def release(self) -> Release:
        return self.harness.release

    def since(self) -> str:
        return "its start" if not self.restarts else f"kubelet restart {self.restarts}"

    async def start(self, release: Release) -> None:
        log = self.logs / f"kubelet-{self.restarts}-{release.name}.log"
        harness = await self._stack.enter_async_context(
            running_harness(release, self.binaries[release], self.plugin_dir, log)
        )
        self._harness = harness
        running = [f"{p.uid}/{c.name}" for p in self.pods for c in p.containers]
        self.pod_resources.parent.mkdir(exist_ok=True)
        await harness.start(self.pods, running, self.watcher_dir, pod_resources_socket=self.pod_resources)

    async def stop(self) -> None:
        self._harness = None
        await self._stack.aclose()

    async def restart(self, release: Release) -> None:
        """Stop the manager and start `release`'s on the same directory (its checkpoint)."""
        await self.stop()
        self.restarts += 1
        await self.start(release)

    async def admit(self, pod: Pod) -> dict[str, dict[str, list[str]]]:
        got = await self.harness.admit(pod)
        self.pods.append(pod)
        return got

    async def end_pod(self, uid: str) -> None:
        await self.harness.remove_pod(uid)
        self.pods = [p for p in self.pods if p.uid != uid]


@dataclass
class JudgedWorld(DevshimSide):
    registration: str
    kubelet: UpstreamKubelet
    cell_release: Release  # the release of the cell's column (a downgrade starts one up)

    @property
    def release(self) -> Release:
        return self.kubelet.release

    async def expected(self, resource: str) -> list[tuple[str, str, tuple[int, ...]]]:
        """The driver's devices now: (id, health, NUMA nodes), sorted."""
        devices = await self.host.sources[resource].list_devices()
        return sorted((d.id, str(d.health), tuple(d.numa_nodes)) for d in devices)

    async def registered(self, resource: str, timeout_s: float = START_TIMEOUT_S) -> Capacity:
        """Until the manager counts every device the driver lists for `resource`, and its
        Healthy ones as allocatable (a stopped endpoint has every device unhealthy), and devshim
        knows it registered: the manager counts from the first list it reads, which can come
        before devshim reads the Register's answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            devices = await self.expected(resource)
            want, healthy = len(devices), sum(d[1] == HEALTHY for d in devices)
            got = await self.kubelet.harness.capacity()
            served = self.shim.served.get(resource)
            known = served is not None and served.endpoint.registered
            if got.capacity.get(resource) == want and got.allocatable.get(resource) == healthy and known:
                return got
            if loop.time() > deadline:
                raise Failed(
                    f"{resource}: the {self.release.name} device manager counts "
                    f"{got.capacity.get(resource, 'no')} devices, {got.allocatable.get(resource, 'none')} "
                    f"allocatable; the driver lists {want}, {healthy} Healthy; devshim "
                    f"{'knows it registered' if known else 'is not registered'}, {timeout_s:g} s after "
                    f"{self.kubelet.since()}"
                    f"{self.kubelet.harness.log_tail()}"
                )
            await asyncio.sleep(POLL_S)

    async def allocatable(self, resource: str) -> list[tuple[str, str, tuple[int, ...]]]:
        """GetAllocatableDevices for `resource`: its healthy devices, sorted."""
        got = await self.kubelet.harness.allocatable()
        return sorted((d["id"], d["health"], tuple(d["numa"])) for d in got.get(resource, []))


@asynccontextmanager
async def judged_world(
    driver: DriverUnderTest,
    release: Release,
    registration: str,
    binaries: Mapping[Release, Path],
    first: Release | None = None,
) -> AsyncIterator[JudgedWorld]:
    """A running world: the manager of `first` (default: `release`) started, devshim up, every
    resource counted."""
    root = Path(tempfile.mkdtemp(prefix="ds-judge-", dir="/tmp"))  # short: socket paths
    settings = settings_for(driver, registration, root, restart_backoff_s=DRIVER_RESTART_S)
    for folder in ("device-plugins", "plugins_registry", "pod-resources"):
        (root / folder).mkdir()
    kubelet = UpstreamKubelet(binaries, root, watcher=registration == "watcher")
    try:
        try:
            # The kubelet first, as on a node: devshim finds its socket and registers.
            await kubelet.start(first or release)
            running = AsyncExitStack()
            shim = await running.enter_async_context(Shim(settings, policies=driver.policies))
            world = JudgedWorld(
                shim, driver, root, registration=registration, kubelet=kubelet, cell_release=release,
                settings=settings, running=running,
            )  # fmt: skip
            try:
                await world.driver_up()
                for resource in world.resources:
                    await world.registered(resource)
                yield world
            finally:
                await world.running.aclose()  # whichever devshim runs by then
        finally:
            await kubelet.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)

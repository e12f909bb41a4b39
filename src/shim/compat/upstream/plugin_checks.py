"""The plugin checks (`devshim compat --plugin CMD`) with the kubelet's real device manager.

Each cell starts the release's harness on a temp device-plugins directory, then the plugin
(with `{dir}`, or bound over /var/lib/kubelet/device-plugins in a namespace of its own, as the
model's cells do), and judges it by what the manager does with it. The rows keep the model's
names (plugin_checks.py); the two the real manager shows only through another row's verdict
skip and say which.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from shim.compat.driver_world import run_health_hook
from shim.compat.plugin_checks import CHANGE_S
from shim.compat.plugin_process import (
    crash_twice_in_a_second,
    in_namespace,
    kill_plugin,
    sockets_made,
    start_plugin,
    stop_plugin,
    until_ready,
)
from shim.compat.plugin_world import NO_HOOK, PluginUnderTest
from shim.compat.results import Failed, Result, Skip, expect, run_cells
from shim.facts import KUBELET_SOCKET, REGISTER_TIMEOUT_S

from .harness import Container, Pod
from .releases import Release
from .world import UpstreamKubelet

SETTLE_S = 0.3
STREAM_OPEN_S = 2.0
POLL_S = 0.05
CELL_TIMEOUT_S = 60.0


@dataclass
class JudgedPluginWorld:
    plugin: PluginUnderTest
    kubelet: UpstreamKubelet
    process: asyncio.subprocess.Process
    log: Path
    plugin_dir: Path
    argv: list[str]

    async def crash_and_start(self) -> None:
        """SIGKILL the plugin (nothing cleaned up) and start it again at once."""
        await kill_plugin(self.process)
        self.process = await start_plugin(self.argv, self.plugin.env, self.log, append=True)

    async def stop(self) -> None:
        await stop_plugin(self.process)

    def log_tail(self) -> str:
        text = self.log.read_bytes()[-2000:].decode(errors="replace").strip() if self.log.exists() else ""
        tail = text.splitlines()[-5:]
        return f"; the plugin's log ends: {' | '.join(tail)}" if tail else "; the plugin logged nothing"

    async def allocatable_until(
        self, resource: str, wanted: Callable[[list[str]], bool], timeout_s: float = REGISTER_TIMEOUT_S
    ) -> list[str]:
        """The IDs the manager holds allocatable for `resource`, sorted, once they are `wanted`;
        TimeoutError after `timeout_s`."""
        async with asyncio.timeout(timeout_s):
            while not wanted(
                ids := sorted(d["id"] for d in (await self.kubelet.harness.allocatable()).get(resource, []))
            ):
                await asyncio.sleep(POLL_S)
        return ids

    async def resource(self, timeout_s: float = REGISTER_TIMEOUT_S) -> tuple[str, int]:
        """The first resource the manager counts devices of, and how many, once it does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            capacity = await self.kubelet.harness.capacity()
            counted = sorted((r, n) for r, n in capacity.capacity.items() if n > 0)
            if counted:
                return counted[0]
            if self.process.returncode is not None:
                raise Failed(f"the plugin exited with {self.process.returncode}{self.log_tail()}")
            if loop.time() > deadline:
                raise Failed(
                    f"the {self.kubelet.release.name} device manager counted no device of the plugin "
                    f"within {timeout_s:g} s of {self.kubelet.since()}{self.log_tail()}"
                    f"{self.kubelet.harness.log_tail()}"
                )
            await asyncio.sleep(POLL_S)


async def serves_before_register(w: JudgedPluginWorld) -> None:
    """The manager registers the plugin and counts its devices: it dials the plugin's socket
    inside Register (since 1.25) and asks GetDevicePluginOptions, rejecting a plugin that does
    not serve."""
    await w.resource()


async def options(w: JudgedPluginWorld) -> None:
    """The real manager asks GetDevicePluginOptions inside Register."""
    raise Skip("the real manager asks for the options inside Register: serves_before_register judges it")


async def full_lists(w: JudgedPluginWorld) -> None:
    """The manager keeps counting the plugin's devices: it takes each ListAndWatch message as the
    full list, so a plugin that sends changes only would shrink the count."""
    resource, count = await w.resource()
    await asyncio.sleep(SETTLE_S)
    now = (await w.kubelet.harness.capacity()).capacity.get(resource)
    expect(now == count, f"{resource}: the manager counted {count} devices, then {now}")


async def stream_open(w: JudgedPluginWorld) -> None:
    """The devices stay allocatable 2 s after the first list: the manager takes the end of
    ListAndWatch for the plugin going away and marks every device unhealthy."""
    resource, _ = await w.resource()
    await asyncio.sleep(SETTLE_S)
    first = (await w.kubelet.harness.capacity()).allocatable.get(resource, 0)
    if not first:
        raise Skip(f"{resource}: no Healthy device, so a stream's end would not show")
    await asyncio.sleep(STREAM_OPEN_S)
    now = (await w.kubelet.harness.capacity()).allocatable.get(resource, 0)
    expect(
        now == first,
        f"{resource}: {first} devices allocatable, {now} {STREAM_OPEN_S:g} s later: the manager took the "
        f"plugin as gone (its ListAndWatch ended)",
    )


async def reregister(w: JudgedPluginWorld) -> None:
    """After a kubelet restart (this release's own cleanup of device-plugins/), the plugin
    registers again and the new manager counts its devices."""
    resource, _ = await w.resource()
    await w.kubelet.restart(w.kubelet.release)
    again, _ = await w.resource()
    expect(again == resource, f"registered {again} after the restart, {resource} before")


async def crash_restart(w: JudgedPluginWorld) -> None:
    """Killed and started again at once, twice, both starts within one second (the model's row):
    the manager counts the plugin's devices allocatable again, as before the crash."""
    resource, _ = await w.resource()
    await asyncio.sleep(SETTLE_S)
    before = (await w.kubelet.harness.capacity()).allocatable.get(resource, 0)
    if not before:
        raise Skip(f"{resource}: no Healthy device, so the manager would show no return")
    since = 0.0

    async def restart() -> None:
        nonlocal since
        since = time.time()
        await w.crash_and_start()

    async def came_up() -> None:  # a socket made anew: the plugin serves (and registers next)
        made = lambda: bool(sockets_made(w.plugin_dir, since) - {KUBELET_SOCKET})  # noqa: E731
        await until_ready(made, w.process, REGISTER_TIMEOUT_S, "make its socket after a crash", w.log_tail)

    await crash_twice_in_a_second(restart, came_up)

    async def counted() -> bool:
        return (await w.kubelet.harness.capacity()).allocatable.get(resource, 0) == before

    try:
        async with asyncio.timeout(REGISTER_TIMEOUT_S):
            while not await counted():
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise Failed(
            f"killed and started again at once, the second start within the second of the first: "
            f"the {w.kubelet.release.name} device manager did not count {before} {resource} "
            f"allocatable again within {REGISTER_TIMEOUT_S:g} s{w.log_tail()}"
        ) from None


async def change_after_dropped_stream(w: JudgedPluginWorld) -> None:
    """With --health-hook: a kubelet restart drops the manager's ListAndWatch stream; once the
    plugin has registered again and the new manager counts its devices, the hook changes the
    last allocatable device, which leaves the allocatable devices within 5 s (the model's row).
    A plugin whose list loop outlives its stream takes the change there, and the manager never
    hears of it."""
    if w.plugin.change_hook is None:
        raise Skip(NO_HOOK)
    resource, _ = await w.resource()
    await w.kubelet.restart(w.kubelet.release)
    again, _ = await w.resource()
    expect(again == resource, f"registered {again} after the restart, {resource} before")
    devices = await w.allocatable_until(resource, bool)
    device = devices[-1]
    env = {**w.plugin.env, "DEVSHIM_COMPAT_PLUGIN_PID": str(w.process.pid)}
    await run_health_hook(w.plugin.change_hook, env, resource, device, w.process.pid)
    try:
        await w.allocatable_until(resource, lambda ids: device not in ids, CHANGE_S)
    except TimeoutError:
        raise Failed(
            f"the health hook changed {device} after a kubelet restart dropped the first ListAndWatch "
            f"stream, but the {w.kubelet.release.name} device manager still had it allocatable "
            f"{CHANGE_S:g} s later: a list loop left running for the dropped stream may be taking the "
            f"plugin's changes{w.log_tail()}"
        ) from None


async def allocate(w: JudgedPluginWorld) -> None:
    """A pod asking one device is admitted (Allocate, with GetPreferredAllocation where the
    plugin offers it) and the runtime gets its options (PreStartContainer where asked)."""
    resource, _ = await w.resource()
    if not (await w.kubelet.harness.capacity()).allocatable.get(resource):
        raise Skip(f"{resource}: no Healthy device to allocate")
    got = (await w.kubelet.admit(Pod("judge-pod-0", "p0", [Container("app", {resource: 1})])))["app"]
    expect(len(got.get(resource, [])) == 1, f"{resource}: the container got {got}")
    await w.kubelet.harness.run_options("judge-pod-0", "app")


async def message_limit(w: JudgedPluginWorld) -> None:
    """An oversized ListAndWatch message shows to the manager only as its stream ending."""
    raise Skip("the real manager shows an oversized list only as its stream ending: stream_open judges it")


CHECKS: dict[str, Callable[[JudgedPluginWorld], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        serves_before_register,
        options,
        full_lists,
        stream_open,
        reregister,
        crash_restart,
        change_after_dropped_stream,
        allocate,
        message_limit,
    )
}


@asynccontextmanager
async def judged_plugin_world(
    plugin: PluginUnderTest, release: Release, binaries: Mapping[Release, Path]
) -> AsyncIterator[JudgedPluginWorld]:
    if plugin.command is None:
        raise Skip("--socket: the upstream judge starts the plugin itself")
    root = Path(tempfile.mkdtemp(prefix="ds-judge-", dir="/tmp"))
    plugin_dir, log = root / "device-plugins", root / "plugin.log"
    plugin_dir.mkdir()
    kubelet = UpstreamKubelet(binaries, root, watcher=False)
    try:
        async with contextlib.AsyncExitStack() as stack:
            await kubelet.start(release)
            stack.push_async_callback(kubelet.stop)
            argv = plugin.argv(plugin_dir)
            if plugin.hardcodes_dir:
                argv = await stack.enter_async_context(in_namespace(plugin_dir, argv))
            process = await start_plugin(argv, plugin.env, log)
            world = JudgedPluginWorld(plugin, kubelet, process, log, plugin_dir, argv)
            stack.push_async_callback(world.stop)  # whichever process runs by then
            yield world
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def run_judged_plugin_cell(
    plugin: PluginUnderTest, release: Release, check: str, binaries: Mapping[Release, Path]
) -> None:
    async with judged_plugin_world(plugin, release, binaries) as world:
        await CHECKS[check](world)


async def run_judged_plugin_matrix(
    plugin: PluginUnderTest,
    cells: Sequence[tuple[str, Release]],
    binaries: Mapping[Release, Path],
    *,
    timeout_s: float = CELL_TIMEOUT_S,
    progress: Callable[[Result], None] = lambda result: None,
) -> list[Result]:
    runs = ((c, r.name, functools.partial(run_judged_plugin_cell, plugin, r, c, binaries)) for c, r in cells)
    return await run_cells(runs, timeout_s, progress)

"""The rows of the plugin matrix: the kubelet's expectations of any v1beta1 device plugin.

`devshim compat --plugin CMD` runs each check against each kubelet behaviour profile, every cell
in a fresh world (plugin_world.py: temp directory, fake kubelet of that profile speaking v1beta1
on the classic path, plugin process). A check returns, raises Failed saying what the kubelet saw,
or raises Skip (with --socket, the rows that must watch the plugin register). The resource name
is whatever the plugin registers first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import grpc

from shim.compat.fakekubelet import CleanupMode, EndpointStopped, PluginSession, ProtocolViolation
from shim.compat.fakekubelet.records import HEALTHY, UNHEALTHY, DeviceState
from shim.facts import REGISTER_TIMEOUT_S

from .modes import PROFILES
from .plugin_process import crash_twice_in_a_second
from .plugin_world import (
    DIAL_TIMEOUT_S,
    NO_HOOK,
    RPC_TIMEOUT_S,
    PluginUnderTest,
    PluginWorld,
    ProbingKubelet,
    plugin_world,
)
from .results import Failed, Result, Skip, expect, run_cells

Check = Callable[[PluginWorld], Awaitable[None]]
CELL_TIMEOUT_S = 60.0
FIRST_LIST_S = 5.0
STREAM_OPEN_S = 2.0
# The Go test plugin polls its directory every second; vendor plugins are often slower.
# Time for a list after the plugin changed a device (the health hook).
CHANGE_S = 5.0
# Time for a message that follows the first at once (a delta, an oversized list) to arrive.
SETTLE_S = 0.3
# The kubelet dials plugins without grpc.MaxCallRecvMsgSize (client.go dial), so gRPC's default
# receive limit applies; a bigger message ends the stream with RESOURCE_EXHAUSTED.
RECEIVE_LIMIT = "4 MiB"
# What a starting kubelet removes from device-plugins/ (dirs.py, after manager.go CleanupPluginDirectory).
CLEANUP = {
    CleanupMode.KUBELET_1_25: "every file but the checkpoint removed, the plugin's socket with it",
    CleanupMode.KUBELET_1_33: "only sockets removed",
}


async def _first_list(session: PluginSession) -> tuple[DeviceState, ...]:
    try:
        return await session.wait_for_list(timeout=FIRST_LIST_S)
    except TimeoutError:
        raise Failed(f"no ListAndWatch message within {FIRST_LIST_S:g} s of the stream opening") from None
    except EndpointStopped:
        raise Failed(f"ListAndWatch ended before its first message: {session.stream_error}") from None


async def serves_before_register(w: PluginWorld) -> None:
    """The plugin's socket answers gRPC when its Register arrives. Since 1.25 the kubelet dials
    inside Register and rejects a plugin that does not serve within 10 s; 1.24 dials only after
    Register returns, so there the race goes unseen until a slow node loses it."""
    arrival = await w.first_arrival()
    expect(
        arrival.not_serving is None,
        f"the plugin called Register before its socket served: when Register arrived, its socket "
        f"{arrival.socket.name} {arrival.not_serving}; kubelets since 1.25 dial it inside Register "
        f"and reject it ('failed to dial device plugin') unless it serves within 10 s",
    )


async def options(w: PluginWorld) -> None:
    """GetDevicePluginOptions is implemented and answers (kubelets since 1.25 ask inside Register
    and reject a plugin whose call fails)."""
    client = await w.client()
    try:
        await client.get_options(RPC_TIMEOUT_S)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise Failed("GetDevicePluginOptions is not implemented (UNIMPLEMENTED)") from None
        raise Failed(f"GetDevicePluginOptions failed: {err.code().name}: {err.details()}") from None


async def full_lists(w: PluginWorld) -> None:
    """The first ListAndWatch message comes within a few seconds, and every message is a full
    list: not empty, no repeated ID, health exactly "Healthy" or "Unhealthy"."""
    session = await w.session()
    await _first_list(session)
    await asyncio.sleep(SETTLE_S)
    for n, devices in enumerate(session.lists, 1):
        expect(
            bool(devices),
            f"ListAndWatch message {n} lists no device; the kubelet takes each as the full list",
        )
        repeated = sorted(i for i, count in Counter(d.id for d in devices).items() if count > 1)
        expect(not repeated, f"ListAndWatch message {n} repeats device IDs {repeated}")
        for d in devices:
            expect(
                d.health in (HEALTHY, UNHEALTHY),
                f"device {d.id} has health {d.health!r}; the kubelet compares with exactly "
                f"{HEALTHY!r}, so it counts as unhealthy",
            )


async def stream_open(w: PluginWorld) -> None:
    """ListAndWatch stays open after the first list: the kubelet takes its end for the plugin
    going away and marks every device unhealthy until it registers again."""
    session = await w.session()
    await _first_list(session)
    try:
        async with asyncio.timeout(STREAM_OPEN_S):
            await session.stream_ended.wait()
    except TimeoutError:
        return
    how = "with status OK" if session.stream_error is None else f"with {session.stream_error}"
    raise Failed(
        f"ListAndWatch ended within {STREAM_OPEN_S:g} s of the first list ({how}); the kubelet then "
        f"marks every device unhealthy"
    )


async def reregister(w: PluginWorld) -> None:
    """After a kubelet restart (the profile's own cleanup of device-plugins/), the plugin
    registers again and sends a list on the new session."""
    kubelet = w.started()
    resource = await w.resource()
    await _first_list(await w.session())
    earlier = w.registrations(resource)
    await kubelet.restart()
    cleanup = f"{w.profile} cleanup: {CLEANUP.get(kubelet.profile.cleanup, kubelet.profile.cleanup)}"
    try:
        ok = sum(r.ok for r in earlier) + 1
        await kubelet.wait_for_registration(resource, count=ok, timeout=REGISTER_TIMEOUT_S)
    except TimeoutError:
        rejected = [r.error for r in w.registrations(resource)[len(earlier) :] if not r.ok]
        why = f"; the kubelet rejected Register: {rejected[-1]}" if rejected else ""
        raise Failed(
            f"the plugin did not register again within {REGISTER_TIMEOUT_S:g} s of a kubelet restart "
            f"({cleanup}){why}"
        ) from None
    try:
        await _first_list(await kubelet.wait_for_plugin(resource))
    except Failed as failed:
        raise Failed(f"registered again after a kubelet restart ({cleanup}), but {failed}") from None


async def crash_restart(w: PluginWorld) -> None:
    """Killed (SIGKILL: its socket file left behind) and started again at once, twice, both starts
    within one second: the plugin registers again and sends a list. A plugin that names its
    socket after the second it started in and cannot listen where a stale one is (a public plugin
    did both) never comes back from a crash in the second it started."""
    kubelet = w.started()
    resource = await w.resource()
    await _first_list(await w.session())
    arrived = 0

    async def restart() -> None:
        nonlocal arrived
        arrived = len(kubelet.arrivals)
        await w.crash_and_start()

    async def came_up() -> None:
        more = lambda: len(kubelet.arrivals) > arrived  # noqa: E731
        await w.until(more, REGISTER_TIMEOUT_S, "call Register after a crash")

    await crash_twice_in_a_second(restart, came_up)
    since = time.monotonic()  # the second start's Register comes later: the plugin starts first
    back = lambda: any(r.ok and r.received_at > since for r in w.registrations(resource))  # noqa: E731
    try:
        await kubelet.wait_until(back, timeout=REGISTER_TIMEOUT_S, what=f"{resource} registered again")
    except TimeoutError:
        raise Failed(
            f"killed and started again at once, the second start within the second of the first: "
            f"the plugin did not register again within {REGISTER_TIMEOUT_S:g} s{w.log_tail()}"
        ) from None
    try:
        # A kubelet that dials after Register (1.24) may still hold the killed start's session.
        await w.until(functools.partial(_connected, kubelet, resource), DIAL_TIMEOUT_S, "get connected")
        await _first_list(kubelet.plugin(resource))
    except Failed as failed:
        raise Failed(f"registered again after a crash and a start at once, but {failed}") from None


def _connected(kubelet: ProbingKubelet, resource: str) -> bool:
    """The kubelet holds a session of ``resource`` whose stream has not ended."""
    with contextlib.suppress(KeyError):
        return not kubelet.plugin(resource).stream_ended.is_set()
    return False


async def change_after_dropped_stream(w: PluginWorld) -> None:
    """After the kubelet's ListAndWatch stream is dropped (its connection closed, as a kubelet
    restart or a broken connection ends it) and another is opened, a change the plugin makes (the
    health hook) reaches the new stream. A plugin whose list loop outlives its stream takes
    changes off a shared queue there, and the new stream never sees them (a public plugin had
    this)."""
    if w.plugin.change_hook is None:
        raise Skip(NO_HOOK)
    dropped = await w.session()
    await _first_list(dropped)
    await dropped.close()
    session = await w.connect()
    session.start()
    before = {d.id: d.health for d in await _first_list(session)}
    device = next((i for i, health in reversed(before.items()) if health == HEALTHY), None)
    if device is None:
        raise Skip(f"the plugin lists no device with health exactly {HEALTHY!r} to change")
    await w.change(await w.resource() if w.kubelet else session.resource, device)
    try:
        await session.wait_for_list(lambda ds: {d.id: d.health for d in ds} != before, timeout=CHANGE_S)
    except EndpointStopped:
        ended = session.stream_error
        raise Failed(f"ListAndWatch ended after the health hook changed {device}: {ended}") from None
    except TimeoutError:
        raise Failed(
            f"the health hook changed {device}, but the ListAndWatch stream opened after the first was "
            f"dropped got no new list within {CHANGE_S:g} s: a list loop left running for the dropped "
            f"stream may be taking the plugin's changes"
        ) from None
    finally:
        await session.close()


async def allocate(w: PluginWorld) -> None:
    """Allocate of one Healthy device for one container answers exactly one
    ContainerAllocateResponse (asked on a connection of its own, whatever the stream does)."""
    devices = await _first_list(await w.session())
    healthy = [d.id for d in devices if d.health == HEALTHY]
    if not healthy:
        raise Skip(f"the plugin lists no device with health exactly {HEALTHY!r}: the kubelet allocates none")
    connection = await w.connect()
    try:
        await connection.allocate(healthy[:1])
    except ProtocolViolation as err:
        raise Failed(
            f"{err}; the kubelet needs one per container (with none it fails the pod's admission)"
        ) from None
    except grpc.aio.AioRpcError as err:
        raise Failed(f"Allocate of {healthy[0]} failed: {err.code().name}: {err.details()}") from None


async def message_limit(w: PluginWorld) -> None:
    """Every ListAndWatch message fits the kubelet's 4 MiB gRPC receive limit."""
    session = await w.session()
    with contextlib.suppress(TimeoutError, EndpointStopped):  # an oversized first message ends the stream
        await session.wait_for_list(timeout=FIRST_LIST_S)
    await asyncio.sleep(SETTLE_S)
    error = session.stream_error or ""
    expect(
        "RESOURCE_EXHAUSTED" not in error,
        f"a ListAndWatch message exceeded the kubelet's {RECEIVE_LIMIT} gRPC receive limit, which ends "
        f"the stream: {error}",
    )
    if not session.lists:
        raise Skip(f"no ListAndWatch message arrived within {FIRST_LIST_S:g} s to measure")


PLUGIN_CHECKS: dict[str, Check] = {
    "serves_before_register": serves_before_register,
    "options": options,
    "full_lists": full_lists,
    "stream_open": stream_open,
    "reregister": reregister,
    "crash_restart": crash_restart,
    "change_after_dropped_stream": change_after_dropped_stream,
    "allocate": allocate,
    "message_limit": message_limit,
}


async def run_plugin_cell(plugin: PluginUnderTest, profile: str, check: str) -> None:
    """One cell: the check in a fresh world of the profile (Skip/Failed as the check raises)."""
    async with plugin_world(plugin, profile) as world:
        await PLUGIN_CHECKS[check](world)


async def run_plugin_matrix(
    plugin: PluginUnderTest,
    cells: Sequence[tuple[str, str]],
    *,
    timeout_s: float = CELL_TIMEOUT_S,
    progress: Callable[[Result], None] = lambda result: None,
) -> list[Result]:
    """Run `cells` (check, profile) one after another; a result per cell, in order."""
    runs = ((c, p, functools.partial(run_plugin_cell, plugin, p, c)) for c, p in cells)
    return await run_cells(runs, timeout_s, progress)


def plugin_cells(
    checks: Sequence[str] | None = None, profiles: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """The selected cells, check-major (all of them by default)."""
    chosen, columns = list(checks or PLUGIN_CHECKS), list(profiles or PROFILES)
    unknown = sorted(set(chosen) - set(PLUGIN_CHECKS)) + sorted(set(columns) - set(PROFILES))
    if unknown:
        raise ValueError(f"unknown checks or profiles {unknown}; checks: {', '.join(PLUGIN_CHECKS)}; "
                         f"profiles: {', '.join(PROFILES)}")  # fmt: skip
    return [(check, profile) for check in chosen for profile in columns]

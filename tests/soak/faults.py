"""One function per fault kind. Each injects its fault into the running world and returns once the
fault has stopped acting (a killed process is dead, a frozen one thawed, a stopped service back),
with the moment it stopped: the soak times recovery from there. None: not applicable right now
(no driver is up to kill, no newer kubelet to upgrade to); the soak then picks another kind.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shim.compat.modes import KUBELET_LINE, PROFILES, Kubelet
from tests.support.devshim_process import runs

from .hostile_driver import ATTACKS
from .hostile_driver import RESOURCE as HOSTILE_RESOURCE
from .invariants import Allocator
from .report import Journal
from .world import HOSTILE, SERVED, World


@dataclass
class Context:
    world: World
    journal: Journal
    rng: random.Random
    allocator: Allocator
    restarts_by_profile: Counter[str] = field(default_factory=Counter)
    # A figure to take once the fault's recovery is timed: (name, measured from this moment).
    pending_figure: tuple[str, float] | None = None


@dataclass(frozen=True)
class Injected:
    variant: str  # which driver, which kubelet, which way: counted in the report
    ended_at: float  # time.monotonic() when the fault stopped acting


Fault = Callable[[Context], Awaitable[Injected | None]]
DEVSHIM_START_TIMEOUT_S = 30.0
# Attacks devshim answers by ending the driver's run (a flood of notifications, a list over the
# bound), and how long that may take.
RESTARTING = ("flood", "oversized")
HOSTILE_RESTART_S = 5.0


def _ended(variant: str) -> Injected:
    return Injected(variant, time.monotonic())


async def _running_drivers(ctx: Context) -> list[tuple[str, int]]:
    """(name, pid) of every driver devshim reports up."""
    status = await ctx.world.devshim.status()
    drivers: dict[str, Any] = status["drivers"] if status else {}
    return [(name, d["pid"]) for name, d in drivers.items() if d["status"] == "up" and d["pid"]]


def _signal(pid: int, signum: signal.Signals) -> bool:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


async def driver_kill(ctx: Context) -> Injected | None:
    """A driver is SIGKILLed (a crash): devshim must list its devices Unhealthy and restart it."""
    drivers = await _running_drivers(ctx)
    if not drivers:
        return None
    name, pid = ctx.rng.choice(drivers)
    return _ended(name) if _signal(pid, signal.SIGKILL) else None


async def _freeze_a_driver(ctx: Context) -> tuple[str, int, str] | None:
    """SIGSTOP one running driver: its name, pid and the resource it serves; None if none is up."""
    drivers = await _running_drivers(ctx)
    if not drivers:
        return None
    name, pid = ctx.rng.choice(drivers)
    resource = next(s.name for s in SERVED if s.driver == name)
    return (name, pid, resource) if _signal(pid, signal.SIGSTOP) else None


def _found_by_timeout(outcome: str) -> bool:
    """The probe's Allocate timed out in devshim: devshim found the frozen driver."""
    return outcome.startswith("DEADLINE_EXCEEDED") and "did not answer" in outcome


async def driver_hang(ctx: Context) -> Injected | None:
    """A driver is frozen (SIGSTOP) while the kubelet admits a pod using it: devshim can only tell
    by the call's timeout, must fail that Allocate clearly and restart the driver. Then SIGCONT."""
    frozen = await _freeze_a_driver(ctx)
    if frozen is None:
        return None
    name, pid, resource = frozen
    try:
        probe = asyncio.create_task(ctx.allocator.once(resource))
        await asyncio.sleep(ctx.rng.uniform(0.3, 1.0))
        outcome = await probe
    finally:
        _signal(pid, signal.SIGCONT)
    # Otherwise (the kubelet had no Healthy device of it to choose, or chose while the driver
    # still answered) the freeze went unseen.
    return _ended(f"{name}, {'found by a call timeout' if _found_by_timeout(outcome) else 'unseen'}")


async def driver_freeze(ctx: Context) -> Injected | None:
    """A driver freezes for good (SIGSTOP, never SIGCONT: stuck like a process in the kernel) while
    the kubelet admits a pod using it: devshim must find it by the call's timeout and replace it.
    The fault counts as over once devshim found it: from then on recovery is devshim's doing."""
    frozen = await _freeze_a_driver(ctx)
    if frozen is None:
        return None
    name, pid, resource = frozen
    if not _found_by_timeout(await ctx.allocator.once(resource)):
        _signal(pid, signal.SIGCONT)  # nobody called it: thaw it rather than leave it frozen unseen
        return _ended(f"{name}, unseen")
    return _ended(f"{name}, found by a call timeout")


async def kubelet_restart(ctx: Context) -> Injected | None:
    """The kubelet restarts, as the release whose cleanup of device-plugins/ was tried least so far
    (every profile gets its turn); it keeps speaking v1beta2 only where a `next` kubelet did."""
    fewest = min(ctx.restarts_by_profile[p] for p in PROFILES)
    profile = ctx.rng.choice([p for p in PROFILES if ctx.restarts_by_profile[p] == fewest])
    speaks = ctx.world.kubelet_now.speaks if profile == "next" else "v1beta1"
    ctx.restarts_by_profile[profile] += 1
    await ctx.world.restart_kubelet(Kubelet(profile, speaks), _down(ctx))
    return _ended(f"{profile}/{speaks}")


def _down(ctx: Context) -> float:
    """How long a restarting kubelet is away. At least 50 ms: an instant restart is no real
    kubelet's, and it would hit a devshim race (a Register in flight when the new kubelet's cleanup
    removes the socket just re-served) that tests/soak/test_findings.py pins on its own."""
    return ctx.rng.uniform(0.05, 0.5)


async def _step(ctx: Context, by: int) -> Injected | None:
    i = KUBELET_LINE.index(ctx.world.kubelet_now) + by
    if not 0 <= i < len(KUBELET_LINE):
        return None
    old, new = ctx.world.kubelet_now, KUBELET_LINE[i]
    await ctx.world.restart_kubelet(new, _down(ctx))
    return _ended(f"{old.profile}/{old.speaks} -> {new.profile}/{new.speaks}")


async def kubelet_upgrade(ctx: Context) -> Injected | None:
    """The kubelet restarts as the next one up the line (docs/compat.md): a newer release's
    behaviour, then v1beta2 beside v1beta1, then v1beta2 alone."""
    return await _step(ctx, +1)


async def kubelet_downgrade(ctx: Context) -> Injected | None:
    """The kubelet restarts as the one below it on the line."""
    return await _step(ctx, -1)


async def podresources_down(ctx: Context) -> Injected | None:
    """The kubelet's PodResources service goes away (its socket too) for a while: devshim's
    deallocate emulation must say it is off and come back on by itself."""
    pod_resources = ctx.world.pod_resources
    if not pod_resources.serving:
        return None
    await pod_resources.stop()
    await asyncio.sleep(ctx.rng.uniform(0.3, 1.5))
    await pod_resources.start()
    return _ended("socket removed")


async def podresources_ratelimit(ctx: Context) -> Injected | None:
    """PodResources answers RESOURCE_EXHAUSTED ("rejected by rate limit", like the kubelet's own
    limiter) to every call, or allows 2 a second, for a while: devshim must back off, not fail."""
    pod_resources = ctx.world.pod_resources
    if not pod_resources.serving:
        return None
    every = ctx.rng.random() < 0.5
    before = pod_resources.rejected
    # burst 0: the bucket never holds a token, so every call is rejected.
    qps, burst = (1.0, 0) if every else (2.0, 1)
    pod_resources.throttle(qps, burst)
    await asyncio.sleep(ctx.rng.uniform(0.3, 1.5))
    pod_resources.unthrottle()
    rejected = pod_resources.rejected - before
    return _ended(f"{'every call' if every else '2 per second'}, {'rejected' if rejected else 'not polled'}")


async def socket_deleted(ctx: Context) -> Injected | None:
    """Someone else removes devshim's socket of one resource: devshim must serve a new one and
    register again (the kubelet keeps running)."""
    status = await ctx.world.devshim.status()
    if status is None:
        return None
    resource = ctx.rng.choice(sorted(status["resources"]))
    socket = Path(status["resources"][resource]["socket"])
    try:
        socket.unlink()
    except FileNotFoundError:
        return None
    return _ended(resource)


async def devshim_kill(ctx: Context) -> Injected | None:
    """devshim itself is SIGKILLed (an OOM kill, a node hiccup) and started again after a moment,
    as the DaemonSet would: its drivers must die with it (PR_SET_PDEATHSIG), the new one restore
    the devices from state_dir and take the kubelet over."""
    drivers = await _running_drivers(ctx)
    devshim = ctx.world.devshim
    await devshim.kill()
    deadline = time.monotonic() + 1.0
    while (alive := [pid for _, pid in drivers if runs(pid)]) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    if alive:
        ctx.journal.violate("driver_outlived_devshim", f"driver pids {alive} run 1 s after devshim died")
    await asyncio.sleep(ctx.rng.uniform(0.0, 0.3))
    spawned = await devshim.start()
    # The fault lasts until the new devshim runs, i.e. answers on its ops endpoint: Python's own
    # start-up (about 0.8 s here) is no reaction of devshim's to time. From spawn to healthy is
    # reported beside it, as devshim_spawn_to_healthy_s.
    while await devshim.status() is None:
        if time.monotonic() - spawned > DEVSHIM_START_TIMEOUT_S:
            ctx.journal.violate("devshim_start", f"no answer {DEVSHIM_START_TIMEOUT_S:g} s after its start")
            break
        await asyncio.sleep(0.02)
    answered = time.monotonic()
    ctx.journal.figure("devshim_spawn_to_answer_s", answered - spawned)
    ctx.pending_figure = ("devshim_spawn_to_healthy_s", spawned)
    return Injected(f"{len(drivers)} drivers were up", answered)


async def hostile_attack(ctx: Context) -> Injected | None:
    """The hostile driver makes its next attack (hostile_driver.py, ATTACKS, in turn): take-over,
    forged log lines, a notification flood, grants outside its policy, an oversized list."""
    pid = dict(await _running_drivers(ctx)).get(HOSTILE)
    if pid is None:
        return None
    attack = ATTACKS[ctx.journal.kind("hostile_attack").injected % len(ATTACKS)]
    (ctx.world.root / "hostile-attack").write_text(attack)
    if not _signal(pid, signal.SIGUSR1):
        return None
    if attack == "grant":  # its next Allocates: admit a pod using it now, as the kubelet would
        await ctx.allocator.once(HOSTILE_RESOURCE)
    if attack in RESTARTING:  # devshim must end that run (a new pid, or none while it restarts)
        deadline = time.monotonic() + HOSTILE_RESTART_S
        while dict(await _running_drivers(ctx)).get(HOSTILE) == pid:
            if time.monotonic() > deadline:
                ctx.journal.violate(
                    "hostile_kept", f"{attack}: its run {pid} not ended {HOSTILE_RESTART_S:g} s on"
                )
                break
            await asyncio.sleep(0.02)
    return _ended(attack)


FAULTS: dict[str, Fault] = {
    f.__name__: f
    for f in (driver_kill, driver_hang, driver_freeze, kubelet_restart, kubelet_upgrade,
              kubelet_downgrade, podresources_down, podresources_ratelimit, socket_deleted,
              devshim_kill, hostile_attack)
}  # fmt: skip

"""The soak run: start the world, run the checkers, inject faults at random, report."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shim.compat.modes import PROFILES
from tests.support.waiting import Hung, bounded

from .faults import FAULTS, Context, Injected
from .hostile_driver import FORGED_STAMP
from .invariants import RECOVERY_BUDGET_S, Allocator, GrantChecker, ListChecker, unhealthy, wait_recovered
from .report import Journal
from .world import World, world

# devshim's first start imports grpc and starts its drivers cold: give it time.
START_TIMEOUT_S = 60.0
# A fault that has not recovered by then is reported, and the soak stops: every fault after it
# would only wait out this same bound again (30 faults x 15 s is past CI's timeout).
RECOVERY_TIMEOUT_S = 15.0
# Injecting one fault takes a few seconds at most; past this it hung, and says where.
FAULT_TIMEOUT_S = 60.0
# After the last fault everything must stay healthy this long.
FINAL_HOLD_S = 1.0
LOG_TAIL_CHARS = 6000


class SoakError(Exception):
    """The soak could not run at all (devshim never came up); the message says what was seen."""


@dataclass(frozen=True)
class SoakOptions:
    faults: int = 36
    seed: int = 1
    kinds: tuple[str, ...] = tuple(FAULTS)
    # The chance that the next fault follows before this one has recovered (faults on top of
    # faults); its recovery is then not timed on its own.
    overlap: float = 0.25
    # The longest quiet pause between a recovery and the next fault.
    pause_s: float = 0.2
    keep: bool = False  # keep the temp dir (devshim's log) afterwards


async def run_soak(options: SoakOptions, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    unknown = set(options.kinds) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(FAULTS)}")
    rng = random.Random(options.seed)
    journal = Journal()
    async with world(keep=options.keep) as w:
        checker = ListChecker(journal, w.sessions)
        grant_checker = GrantChecker(journal, w.kubelet.grants)
        allocator = Allocator(w, journal, random.Random(rng.random()))
        await _started(w)
        background = [
            asyncio.create_task(checker.run()),
            asyncio.create_task(grant_checker.run()),
            asyncio.create_task(allocator.run()),
        ]
        try:
            ctx = Context(w, journal, rng, allocator)
            if await _inject(ctx, options, progress):
                await _hold(w, journal)
        finally:
            for task in background:
                task.cancel()
            stopped = asyncio.gather(*background, return_exceptions=True)
            await bounded(stopped, 10, "the list checker and the allocator to stop once cancelled")
        checker.sweep()
        grant_checker.sweep()
        status = await w.devshim.status()
        exit_code = await w.devshim.stop()
        if exit_code != 0:
            journal.violate("unclean_exit", f"devshim exited {exit_code} on SIGTERM")
        _no_forged_lines(w, journal)
        # The work dir goes with the world: keep the end of devshim's log where it explains a failure.
        tail = w.devshim.log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if journal.violations else None
        return journal.report(
            seed=options.seed,
            faults_requested=options.faults,
            devshim_starts=w.devshim.starts,
            podresources={"calls": w.pod_resources.calls, "rejected": w.pod_resources.rejected},
            devshim_status_at_end=status,
            workdir=str(w.root) if options.keep else None,
            devshim_log_tail=tail,
        )


def _no_forged_lines(w: World, journal: Journal) -> None:
    """(e) No line of devshim's log is one the hostile driver wrote to look like devshim's own."""
    journal.fault = "the log, read at the end"
    with w.devshim.log.open(errors="replace") as log:
        for line in log:
            if line.startswith(FORGED_STAMP):
                journal.violate("forged_log_line", line.rstrip()[:300])


async def _started(w: World) -> None:
    took, wrong = await wait_recovered(w, time.monotonic(), START_TIMEOUT_S)
    if took is None:
        tail = w.devshim.log.read_text(errors="replace")[-3000:] if w.devshim.log.exists() else ""
        raise SoakError(f"devshim did not come up within {START_TIMEOUT_S:g} s: {wrong}\n{tail}")


async def _inject(ctx: Context, options: SoakOptions, progress: Callable[[str], None]) -> bool:
    """Inject every fault, each followed by its recovery; False when one did not recover."""
    # Every kind is owed once (in a shuffled order) before kinds are drawn at random, so even a
    # short run injects each, and a kubelet restart once per profile (kubelet_restart takes the
    # profile restarted least); a kind that does not apply yet stays owed.
    restarts = ["kubelet_restart"] * (len(PROFILES) - 1) if "kubelet_restart" in options.kinds else []
    owed = [*options.kinds, *restarts]
    ctx.rng.shuffle(owed)
    for n in range(1, options.faults + 1):
        ctx.pending_figure = None
        kind, injected = await _one(ctx, owed, options.kinds, n)
        stats = ctx.journal.kind(kind)
        stats.injected += 1
        stats.variants[injected.variant] += 1
        if n % 50 == 0:
            progress(f"{n} faults, {len(ctx.journal.violations)} violations, {ctx.journal.now():.0f} s")
        if n < options.faults and ctx.rng.random() < options.overlap:
            stats.overlapped += 1
            await asyncio.sleep(ctx.rng.uniform(0.0, 0.25))
            continue
        took, wrong = await wait_recovered(ctx.world, injected.ended_at, RECOVERY_TIMEOUT_S)
        if took is None:
            why = f"{injected.variant}: not healthy {RECOVERY_TIMEOUT_S:g} s after it: {wrong}"
            ctx.journal.violate("no_recovery", why)
            progress(f"fault #{n} {kind} did not recover; the soak stops here")
            return False
        stats.recoveries.append(took)
        if ctx.pending_figure is not None:
            name, since = ctx.pending_figure
            ctx.journal.figure(name, injected.ended_at + took - since)
        if took > RECOVERY_BUDGET_S:
            why = f"{injected.variant}: healthy only {took:.3f} s after it; meanwhile: {wrong}"
            ctx.journal.violate("slow_recovery", why)
        ctx.journal.fault = f"quiet after #{n} {kind}"
        await asyncio.sleep(ctx.rng.uniform(0.0, options.pause_s))
    return True


async def _one(ctx: Context, owed: list[str], kinds: tuple[str, ...], n: int) -> tuple[str, Injected]:
    """Inject the next fault that applies now: an owed kind if one does, else one drawn at random."""
    deadline = time.monotonic() + FAULT_TIMEOUT_S
    while time.monotonic() < deadline:
        for kind in [*owed, *(ctx.rng.choice(kinds) for _ in range(2 * len(kinds)))]:
            ctx.journal.fault = f"#{n} {kind}"
            injected = await bounded(FAULTS[kind](ctx), FAULT_TIMEOUT_S, f"injecting fault #{n} {kind}")
            if injected is not None:
                if kind in owed:
                    owed.remove(kind)
                return kind, injected
        await asyncio.sleep(0.1)  # nothing applies now (every driver restarting): wait a moment
    status = await ctx.world.devshim.status()
    why = f"none of {', '.join(kinds)} applied for {FAULT_TIMEOUT_S:g} s"
    raise Hung(f"fault #{n}: {why}; devshim's status: {status}")


async def _hold(w: World, journal: Journal) -> None:
    """After the last fault: everything stays healthy for FINAL_HOLD_S."""
    journal.fault = "after the last fault"
    deadline = time.monotonic() + FINAL_HOLD_S
    while time.monotonic() < deadline:
        wrong = await unhealthy(w)
        if wrong is not None:
            journal.violate("unstable_after_recovery", wrong)
            return
        await asyncio.sleep(0.05)

"""Row 6: kubelet restart (kubelet.sock re-created) -> Register received.

devshim (4 static devices) and the baseline, bench/minimal_plugin.py (polling
kubelet.sock every 10 ms), run as processes, each with its own fake kubelet in
its own directory; the two kubelets restart in alternation, cleaning up as
kubelet 1.25-1.32 and 1.33+ do in turn. Measured: kubelet.sock re-created ->
Register received, both CLOCK_MONOTONIC in this process; after each restart
the next list must hold all 4 devices.
"""

from __future__ import annotations

import asyncio
import sys

from bench.common import ROOT, Result, number, ratio, running, start_devshim, stats_ms, workdir
from shim.compat.fakekubelet import CleanupMode, FakeKubelet

RESOURCE = "example.com/bench"


async def restart(kubelet: FakeKubelet, n: int, mode: CleanupMode) -> float:
    """Restart ``kubelet`` for the ``n``-th time; seconds from kubelet.sock to Register."""
    await asyncio.sleep(0.05)  # let the previous registration settle, as in a real restart
    recreated = await kubelet.restart(mode)
    record = await kubelet.wait_for_registration(RESOURCE, count=n + 1, timeout=30)
    session = await kubelet.wait_for_plugin(RESOURCE)
    devices = await session.wait_for_list()
    assert len(devices) == 4, f"restart {n}: {devices}"
    return record.received_at - recreated


async def reregister(quick: bool) -> Result:
    restarts = 10 if quick else 50
    with workdir() as work:
        ours_dir, base_dir = work / "devshim", work / "minimal"
        async with FakeKubelet(ours_dir) as ours, FakeKubelet(base_dir) as base:
            devshim = await start_devshim(ours_dir, f"{RESOURCE}=4")
            args = ["-m", "bench.minimal_plugin", str(base_dir), RESOURCE]
            minimal = await asyncio.create_subprocess_exec(sys.executable, *args, cwd=ROOT)
            async with running(devshim), running(minimal):
                for kubelet in (ours, base):
                    await kubelet.wait_for_registration(RESOURCE, timeout=30)
                d: list[float] = []
                b: list[float] = []
                for n in range(1, restarts + 1):
                    mode = list(CleanupMode)[n % 2]
                    d.append(await restart(ours, n, mode))
                    b.append(await restart(base, n, mode))
    base_stats, ours_stats = stats_ms(b), stats_ms(d)
    p50, p99 = ours_stats["p50_ms"], ours_stats["p99_ms"]
    misses = [f"p50 {p50 - 10:.1f} ms over"] if p50 > 10 else []
    if p99 > 50:
        misses.append(f"p99 {p99 - 50:.1f} ms over")
    return Result(
        "kubelet restart -> Register received",
        base_stats,
        ours_stats,
        f"p50 {number(p50)} ms, p99 {number(p99)} ms ({ratio(p50, base_stats['p50_ms'])}x baseline at p50)",
        "p50 ≤ 10 ms, p99 ≤ 50 ms",
        not misses,
        "; ".join(misses),
        f"baseline: a minimal plugin polling kubelet.sock every 10 ms; {restarts} restarts each, "
        "cleanup as kubelet 1.25-1.32 and 1.33+ in turn",
    )

"""Row 9: 64 concurrent Allocates beside the same 64 one after another.

devshim serves a sim resource answering allocate per call (over the JSON-RPC
pipe); the fake kubelet sends 64 Allocates of one device each, in alternating
rounds: one after another, then all at once. Throughput is 64 calls over the
batch's wall time (median over rounds); p99 is over every call's latency.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable

from bench.common import Result, percentile, running, sim_driver, start_devshim, workdir, write_config
from shim.compat.fakekubelet import FakeKubelet, PluginSession

RESOURCE = "example.com/sim-call"
CALLS = 64
GRANT = {
    "envs": {"BENCH": "{ids}"},
    "device_nodes": [{"container_path": "/dev/b{id}", "host_path": "/dev/null"}],
}


async def latency(call: Awaitable[object]) -> float:
    start = time.perf_counter()
    await call
    return time.perf_counter() - start


async def batch(session: PluginSession, concurrent: bool) -> tuple[float, list[float]]:
    """Wall seconds of 64 Allocates, and each call's latency."""
    calls = [session.allocate([f"dev{i}"]) for i in range(CALLS)]
    start = time.perf_counter()
    if concurrent:
        latencies = list(await asyncio.gather(*(latency(c) for c in calls)))
    else:
        latencies = [await latency(c) for c in calls]
    return time.perf_counter() - start, latencies


async def concurrency(quick: bool) -> Result:
    rounds = 5 if quick else 30
    with workdir() as work:
        sim = sim_driver(work, [{"name": RESOURCE, "count": CALLS, "id_prefix": "dev", "grant": GRANT}])
        config = write_config(work / "devshim.yaml", {"sim": sim})
        async with (
            FakeKubelet(work / "dp") as kubelet,
            running(await start_devshim(work / "dp", config=config)),
        ):
            session = await kubelet.wait_for_plugin(RESOURCE, timeout=60)
            await session.wait_for_list(lambda devices: len(devices) == CALLS)
            walls: dict[bool, list[float]] = {False: [], True: []}
            calls: dict[bool, list[float]] = {False: [], True: []}
            for n in range(rounds + 1):
                for concurrent in (False, True):
                    wall, latencies = await batch(session, concurrent)
                    if n:  # round 0 warms up
                        walls[concurrent].append(wall)
                        calls[concurrent] += latencies
    figures = {
        c: {
            "calls_per_s": round(CALLS / statistics.median(walls[c])),
            "p50_ms": round(statistics.median(calls[c]) * 1000, 2),
            "p99_ms": round(percentile(calls[c], 99) * 1000, 2),
        }
        for c in (False, True)
    }
    seq, conc = figures[False], figures[True]
    speedup = round(conc["calls_per_s"] / seq["calls_per_s"], 2)
    met = speedup > 1
    return Result(
        f"{CALLS} concurrent Allocates vs sequential",
        seq,
        conc,
        f"{speedup}x the sequential throughput",
        "concurrent throughput > sequential",
        met,
        "" if met else f"{1 - speedup:.2f}x short",
        f"per-call sim resource through the fake kubelet; {rounds} rounds of {CALLS} each way; "
        "p50/p99: each call's latency (concurrent calls queue behind each other)",
    )

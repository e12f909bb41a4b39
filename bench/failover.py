"""Row 7: driver SIGKILL -> the kubelet sees every device Unhealthy; -> Healthy again.

devshim runs the sim driver (4 devices); each round the driver is SIGKILLed
after it has been up for a moment (a crash, not a crash loop: no backoff), and
the fake kubelet's lists are timed from the kill. The baseline, in alternation:
the same sim command spawned here, from the spawn to its answer to initialize
(the driver's own start-up, which any recovery must wait for).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import time

from bench.common import (
    Result,
    children,
    number,
    running,
    sim_driver,
    start_devshim,
    stats_ms,
    workdir,
    write_config,
)
from shim.compat.fakekubelet import FakeKubelet
from shim.sdk import PROTOCOL_VERSION

RESOURCE = "example.com/failover"
INITIALIZE = {"protocol_version": PROTOCOL_VERSION, "devshim_version": "0.0.0", "allocations": []}


async def start_up(command: list[str]) -> float:
    """Seconds from spawning ``command`` to its answer to initialize."""
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    async with asyncio.timeout(30):
        line = await proc.stdout.readline()
    answer = json.loads(line)
    elapsed = time.perf_counter() - start
    assert "result" in answer, answer
    proc.kill()
    await proc.wait()
    return elapsed


async def failover(quick: bool) -> Result:
    rounds = 6 if quick else 30
    with workdir() as work:
        sim = sim_driver(work, [{"name": RESOURCE, "count": 4, "id_prefix": "d"}])
        # A driver up for 50 ms counts as stable, so each crash below is restarted at once: the
        # figures are devshim's reaction, not the crash-loop backoff.
        config = write_config(work / "devshim.yaml", {"sim": sim}, restart={"stable_after_s": 0.05})
        to_unhealthy, to_healthy, startup = [], [], []
        async with (
            FakeKubelet(work / "dp") as kubelet,
            running(await start_devshim(work / "dp", config=config)) as devshim,
        ):
            session = await kubelet.wait_for_plugin(RESOURCE, timeout=60)
            for _ in range(rounds):
                await session.wait_for_list(lambda ds: len(ds) == 4 and all(d.healthy for d in ds))
                startup.append(await start_up(sim["command"]))
                await asyncio.sleep(0.1)  # up for a moment: a crash, not a crash loop
                (pid,) = children(devshim.pid)
                crashed = time.perf_counter()
                os.kill(pid, signal.SIGKILL)
                await session.wait_for_list(lambda ds: all(not d.healthy for d in ds), timeout=10)
                to_unhealthy.append(time.perf_counter() - crashed)
                await session.wait_for_list(lambda ds: all(d.healthy for d in ds), timeout=10)
                to_healthy.append(time.perf_counter() - crashed)
    base, down, up = stats_ms(startup), stats_ms(to_unhealthy), stats_ms(to_healthy)
    budget = base["p50_ms"] + 200
    misses = [f"Unhealthy p99 {down['p99_ms'] - 100:.0f} ms over"] if down["p99_ms"] > 100 else []
    if up["p50_ms"] > budget:
        misses.append(f"Healthy p50 {up['p50_ms'] - budget:.0f} ms over")
    beyond = statistics.median(h - s for h, s in zip(to_healthy, startup, strict=True)) * 1000
    return Result(
        "driver SIGKILL -> Unhealthy; -> Healthy again",
        {"start_up_p50_ms": base["p50_ms"], "start_up_p99_ms": base["p99_ms"]},
        {
            "unhealthy_p50_ms": down["p50_ms"],
            "unhealthy_p99_ms": down["p99_ms"],
            "healthy_p50_ms": up["p50_ms"],
            "healthy_p99_ms": up["p99_ms"],
        },
        f"Unhealthy p99 {number(down['p99_ms'])} ms; "
        f"Healthy p50 = start-up + {up['p50_ms'] - base['p50_ms']:.0f} ms",
        "Unhealthy p99 ≤ 100 ms; Healthy p50 ≤ start-up p50 + 200 ms",
        not misses,
        "; ".join(misses),
        f"{rounds} kills; start-up: the sim spawned here until it answers initialize; "
        f"median of (Healthy again - start-up) per round: {beyond:.0f} ms",
    )

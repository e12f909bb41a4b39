"""Driver crash -> what the kubelet sees, and how fast: devshim and the sim as real processes.

For each of N rounds: SIGKILL the sim driver (a child of devshim), then measure
  crash -> a list with every device Unhealthy received by the fake kubelet,
  crash -> a list with every device Healthy again (devshim restarted the driver),
  crash -> an Allocate sent once the devices show Unhealthy succeeds (it waits for the restart).

Usage: python -m bench.failover [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import start_devshim, stop, summary_ms
from tests.compat.kubelet import FakeKubelet

RESOURCE = "example.com/failover"


def driver_pid(devshim_pid: int) -> int:
    for task in Path(f"/proc/{devshim_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            return int(child)
    raise LookupError("devshim has no driver process")


async def main(rounds: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="ds-bench-", dir="/tmp"))
    sim = workdir / "sim.yaml"
    sim.write_text(yaml.safe_dump({"resources": [{"name": RESOURCE, "count": 4, "id_prefix": "d"}]}))
    config = workdir / "devshim.yaml"
    command = [sys.executable, "-m", "devshim_adapters.sim", "--config", str(sim)]
    # A driver up for 50 ms counts as stable, so each crash below is restarted at once: the
    # figures are devshim's reaction, not the crash-loop backoff.
    restart = {"stable_after_s": 0.05}
    config.write_text(
        yaml.safe_dump(
            {
                "state_dir": str(workdir / "state"),
                "drivers": [{"name": "sim", "command": command, "restart": restart}],
            }
        )
    )
    kubelet = FakeKubelet(workdir / "dp")
    await kubelet.start()
    devshim = await start_devshim(workdir / "dp", config=config)
    to_unhealthy, to_healthy, allocate = [], [], []
    try:
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=60)
        await session.wait_for_list(lambda ds: len(ds) == 4 and all(d.healthy for d in ds))
        for _ in range(rounds):
            await session.wait_for_list(lambda ds: all(d.healthy for d in ds))
            await asyncio.sleep(0.1)  # up for a moment: a crash, not a crash loop
            pid = driver_pid(devshim.pid)
            crashed = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            await session.wait_for_list(lambda ds: all(not d.healthy for d in ds), timeout=10)
            to_unhealthy.append(time.perf_counter() - crashed)
            # The kubelet chose d1 while it was Healthy; its Allocate arrives mid-restart.
            allocation = asyncio.create_task(session.allocate(["d1"]))
            await session.wait_for_list(lambda ds: all(d.healthy for d in ds), timeout=10)
            to_healthy.append(time.perf_counter() - crashed)
            await allocation
            allocate.append(time.perf_counter() - crashed)
    finally:
        await stop(devshim)
        await kubelet.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"Driver SIGKILLed {rounds} times (sim, 4 devices), seen from the fake kubelet")
    print(f"  crash -> all Unhealthy list   {summary_ms(to_unhealthy)}")
    print(f"  crash -> all Healthy again    {summary_ms(to_healthy)}")
    print(f"  crash -> Allocate succeeded   {summary_ms(allocate)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    asyncio.run(main(parser.parse_args().rounds))

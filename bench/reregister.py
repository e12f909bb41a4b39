"""Re-registration latency after kubelet restarts: kubelet.sock re-created -> Register received.

devshim runs as its own process; the fake kubelet restarts N times per cleanup
mode (kubelet 1.25-1.32: all non-directory files but the checkpoint; 1.33+:
sockets only). Both processes read CLOCK_MONOTONIC, so times compare directly.

Usage: python bench/reregister.py [--restarts N]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from bench.common import start_devshim, stop, summary_ms
from tests.compat.kubelet import CleanupMode, FakeKubelet

RESOURCE = "example.com/bench"


async def measure(mode: CleanupMode, restarts: int) -> list[float]:
    plugin_dir = Path(tempfile.mkdtemp(prefix="ds-bench-", dir="/tmp"))
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    devshim = await start_devshim(plugin_dir, f"{RESOURCE}=4")
    latencies = []
    try:
        await kubelet.wait_for_registration(RESOURCE, timeout=30)
        for n in range(1, restarts + 1):
            await asyncio.sleep(0.05)  # let the previous registration settle, as in a real restart
            recreated = await kubelet.restart(mode)
            record = await kubelet.wait_for_registration(RESOURCE, count=n + 1, timeout=30)
            session = await kubelet.wait_for_plugin(RESOURCE)
            devices = await session.wait_for_list()
            assert len(devices) == 4, f"restart {n}: {devices}"
            latencies.append(record.received_at - recreated)
    finally:
        await stop(devshim)
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    return latencies


async def main(restarts: int) -> None:
    print(
        "Re-registration after kubelet restart (kubelet.sock re-created -> Register received), "
        f"{restarts} restarts per cleanup mode"
    )
    for mode in CleanupMode:
        print(f"  cleanup as kubelet {mode.value:5s} {summary_ms(await measure(mode, restarts))}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=30)
    asyncio.run(main(parser.parse_args().restarts))

"""Row 8: devshim's resident memory with 10k devices over 3 resources, beside devshim with none.

Both runs serve three resources of bench/driver.py to a fake kubelet: 10,000
devices in all, then 0. VmRSS (/proc/PID/status) of the devshim process alone
once every list has arrived; the driver process is reported apart.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.common import (
    Result,
    bench_driver,
    children,
    running,
    start_devshim,
    workdir,
    write_config,
)
from shim.compat.fakekubelet import FakeKubelet

RESOURCES = ("example.com/gpu-a", "example.com/gpu-b", "example.com/gpu-c")
DEVICES = 10_000
GOAL_MB = 120


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise LookupError(f"no VmRSS for {pid}")


async def measure(work: Path, total: int) -> tuple[float, float]:
    """RSS in MB of devshim and of its driver, serving ``total`` devices over RESOURCES."""
    counts = {r: total // 3 + (i < total % 3) for i, r in enumerate(RESOURCES)}
    plugin_dir = work / f"dp{total}"
    config = write_config(work / f"devshim{total}.yaml", {"bench": bench_driver(work / "s", counts)})
    async with (
        FakeKubelet(plugin_dir) as kubelet,
        running(await start_devshim(plugin_dir, config=config)) as devshim,
    ):
        for resource, count in counts.items():
            session = await kubelet.wait_for_plugin(resource, timeout=60)
            await session.wait_for_list(lambda devices, n=count: len(devices) == n, timeout=60)  # type: ignore[misc]
        await asyncio.sleep(1)  # settle: state written, lists sent
        (driver,) = children(devshim.pid)
        return rss_mb(devshim.pid), rss_mb(driver)


async def memory(quick: bool) -> Result:
    with workdir() as work:
        empty, empty_driver = await measure(work, 0)
        full, full_driver = await measure(work, DEVICES)
    met = full <= GOAL_MB
    return Result(
        "devshim RSS, 10k devices over 3 resources",
        {"devshim_mb": empty, "driver_mb": empty_driver},
        {"devshim_mb": full, "driver_mb": full_driver},
        f"{full} MB (+{full - empty:.1f} MB for 10k devices)",
        f"≤ {GOAL_MB} MB",
        met,
        "" if met else f"{full - GOAL_MB:.1f} MB over",
        "VmRSS of the devshim process once all 3 lists arrived; baseline: the same 3 resources, no devices",
    )

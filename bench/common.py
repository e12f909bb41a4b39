"""Shared bits of the benchmarks: percentiles, a devshim subprocess, table printing."""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary_ms(samples: Sequence[float]) -> str:
    ms = [s * 1000 for s in samples]
    return (
        f"n={len(ms):5d}  p50={statistics.median(ms):7.3f} ms  p90={percentile(ms, 90):7.3f} ms  "
        f"p99={percentile(ms, 99):7.3f} ms  max={max(ms):7.3f} ms"
    )


async def start_devshim(
    plugin_dir: Path, *resources: str, config: Path | None = None
) -> asyncio.subprocess.Process:
    args = [
        sys.executable,
        "-m",
        "shim",
        "run",
        "--device-plugins-dir",
        str(plugin_dir),
        "--log-level",
        "WARNING",
    ]
    for resource in resources:
        args += ["-r", resource]
    if config is not None:
        args += ["--config", str(config)]
    return await asyncio.create_subprocess_exec(*args)


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()

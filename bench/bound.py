"""Drivers holding devshim's whole device bound: devshim's RSS and another resource's Allocate.

Usage: python -m bench.bound [--quick] [--json FILE], or the row ``bound`` of ``python -m bench``.
One devshim runs the sim (8 devices, per-call grants: each Allocate a round trip to it) and
bench/bulk_driver.py drivers that together fill the devices devshim may hold in all
(``max_devices``), each up to the bound of one driver (``drivers[].max_devices``), both at their
defaults: the first with ten resources (the review's attack, one driver's many lists), the
second with two, the others with one. A raw ListAndWatch stream on every resource takes
devshim's lists as bytes, as the kubelet would hold them (devshim encodes each list it serves),
in a process of its own as the kubelet is (bench/list_streams.py).
Phases, in the same devshim, each timing Allocate on the sim's resource every 20 ms and taking
devshim's peak RSS (VmHWM, reset at the phase's start):

- quiet: the bulk drivers' resources list no device;
- held: every list filled (the peak while filling is taken too), nothing re-sent: what holding
  the bound costs another resource;
- re-sending: every bulk driver re-sends one of its lists every second (its first device's
  health flipped), so devshim builds, publishes, encodes and saves lists at the bound again and
  again (the cost of reading a list on the event loop: docs/benchmarks.md, "listflood").

The figures are devshim's own; the drivers share the DaemonSet's memory limit, and their RSS is
reported apart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.common import (
    Result,
    children,
    print_row,
    ratio,
    running,
    sim_command,
    start_devshim,
    workdir,
)
from bench.flood import ALLOCATE, peak_mb, phase, reset_peak, socket_of
from bench.memory import rss_mb
from shim.settings import DriverSettings, Settings

SIM = "example.com/sim-call"
SIM_DEVICES = 8
# deploy/helm/devshim/values.yaml and deploy/base/daemonset.yaml: resources.limits.memory 256Mi.
LIMIT_MB = 256 * 1024 * 1024 / 1e6
RESOURCES_PER_DRIVER = (10, 2)  # the first driver's, the second's; any other has one


def layout(total: int, per_driver: int) -> dict[str, dict[str, int]]:
    """Driver name -> its resources and their device counts: ``total`` devices in all, none
    holding more than ``per_driver``."""
    drivers: dict[str, dict[str, int]] = {}
    for d in range(math.ceil(total / per_driver)):
        devices = min(per_driver, total - d * per_driver)
        count = RESOURCES_PER_DRIVER[d] if d < len(RESOURCES_PER_DRIVER) else 1
        drivers[f"bulk{d}"] = {
            f"example.com/bulk{d}-{r}": devices // count + (r < devices % count) for r in range(count)
        }
    return drivers


def config(work: Path, drivers: dict[str, dict[str, int]], total: int, per_driver: int) -> Path:
    entries: list[dict[str, Any]] = [
        {
            "name": "sim",
            "user": "root",
            "command": sim_command(work, [{"name": SIM, "count": SIM_DEVICES, "id_prefix": "dev"}]),
            "resources": [SIM],
        }
    ]
    for name, resources in drivers.items():
        command = [sys.executable, "-m", "bench.bulk_driver", "--control", str(work / "full")]
        command += [f"--resource={r}={n}" for r, n in resources.items()]
        entry = {
            "name": name,
            "user": "root",
            "command": command,
            "resources": list(resources),
            "max_devices": per_driver,
        }
        entries.append(entry)
    path = work / "devshim.yaml"
    path.write_text(yaml.safe_dump({"drivers": entries, "max_devices": total}))
    return path


@contextlib.asynccontextmanager
async def streams(plugin_dir: Path, names: list[str]) -> AsyncIterator[dict[str, list[float]]]:
    """A raw ListAndWatch stream on each resource, held by another process as the kubelet's
    would be (bench/list_streams.py): the times its lists arrived."""
    arrivals: dict[str, list[float]] = {name: [] for name in names}
    watcher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.list_streams", str(plugin_dir), *names, stdout=asyncio.subprocess.PIPE
    )
    assert watcher.stdout is not None

    async def follow(lines: asyncio.StreamReader) -> None:
        async for line in lines:
            arrivals[line.decode().strip()].append(time.monotonic())

    following = asyncio.create_task(follow(watcher.stdout))
    try:
        yield arrivals
    finally:
        following.cancel()
        watcher.terminate()
        await watcher.wait()


async def bound(quick: bool, total: int | None = None, per_driver: int | None = None) -> Result:
    """``total`` and ``per_driver``: the bounds to fill (default: the settings' defaults)."""
    seconds = 6.0 if quick else 15.0
    total = total or Settings.model_fields["max_devices"].default
    per_driver = per_driver or DriverSettings.model_fields["max_devices"].default
    drivers = layout(total - SIM_DEVICES, per_driver)
    names = [SIM, *(r for resources in drivers.values() for r in resources)]
    figures: dict[str, Any] = {}
    with workdir() as work:
        plugin_dir, control = work / "dp", work / "full"
        plugin_dir.mkdir()
        async with (
            running(
                await start_devshim(plugin_dir, config=config(work, drivers, total, per_driver))
            ) as devshim,
            streams(plugin_dir, names) as lists,
            grpc.aio.insecure_channel(f"unix:{await socket_of(plugin_dir, SIM)}") as channel,
        ):
            async with asyncio.timeout(60):  # every resource's first list
                while not all(lists.values()):
                    await asyncio.sleep(0.05)
            allocate = channel.unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)
            for _ in range(200):  # warm-up
                await allocate(ALLOCATE.SerializeToString(), timeout=30)
            figures["quiet_rss_mb"] = rss_mb(devshim.pid)
            figures["quiet"] = await phase(devshim.pid, allocate, seconds)
            seen = {name: len(arrived) for name, arrived in lists.items()}
            reset_peak(devshim.pid)
            control.write_text("hold")
            async with asyncio.timeout(120):  # every bulk list filled and sent on
                while not all(len(lists[n]) > seen[n] for n in names[1:]):
                    await asyncio.sleep(0.05)
            figures["filling_peak_rss_mb"] = peak_mb(devshim.pid)
            figures["held"] = await phase(devshim.pid, allocate, seconds)
            figures["held_rss_mb"] = rss_mb(devshim.pid)
            sent = sum(map(len, lists.values()))
            control.write_text("resend")
            figures["resending"] = await phase(devshim.pid, allocate, seconds)
            figures["lists_resent"] = sum(map(len, lists.values())) - sent
            figures["drivers_rss_mb"] = round(sum(rss_mb(pid) for pid in children(devshim.pid)), 1)
    quiet, held, resending = figures["quiet"], figures["held"], figures["resending"]
    ratios = {name: ratio(figures[name]["p99_ms"], quiet["p99_ms"]) for name in ("held", "resending")}
    peak = max(held["peak_rss_mb"], resending["peak_rss_mb"], figures["filling_peak_rss_mb"])
    misses = [
        f"{name} p99 {ratios[name] - 2:.2f}x over" for name in ("held", "resending") if ratios[name] > 2
    ]
    misses += [f"peak RSS {peak - LIMIT_MB:.0f} MB over the limit"] if peak >= LIMIT_MB else []
    shape = ", ".join(f"{name} {len(r)}x{max(r.values()):,}" for name, r in drivers.items())
    return Result(
        "drivers at devshim's device bound: devshim RSS, other resource's Allocate",
        {"p50_ms": quiet["p50_ms"], "p99_ms": quiet["p99_ms"], "rss_mb": figures["quiet_rss_mb"]},
        {
            "held_p50_ms": held["p50_ms"],
            "held_p99_ms": held["p99_ms"],
            "held_rss_mb": figures["held_rss_mb"],
            "resending_p50_ms": resending["p50_ms"],
            "resending_p99_ms": resending["p99_ms"],
            "peak_rss_mb": peak,
        },
        f"p99 {ratios['held']}x quiet held, {ratios['resending']}x re-sending; "
        f"peak RSS {peak} MB of the {LIMIT_MB:.0f} MB limit",
        "p99 ≤ 2x quiet with the bound held and re-sent; devshim's peak RSS under the chart's 256 MiB limit",
        not misses,
        ", ".join(misses),
        (
            f"{total:,} devices in all (max_devices), {per_driver:,} per driver: sim {SIM_DEVICES}, {shape}; "
            f"peak RSS filling {figures['filling_peak_rss_mb']} MB, held {held['peak_rss_mb']} MB, "
            f"re-sending {resending['peak_rss_mb']} MB ({figures['lists_resent']} lists in {seconds:g} s); "
            f"drivers' RSS {figures['drivers_rss_mb']} MB besides; "
            f"Allocate failures {quiet['failed']}/{held['failed']}/{resending['failed']}"
        ),
        {"figures": figures, "seconds_per_phase": seconds},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 s phases instead of 15 s")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--max-devices", type=int, help="devices in all (default: max_devices' default)")
    parser.add_argument(
        "--per-driver", type=int, help="devices per driver (default: drivers[].max_devices' default)"
    )
    args = parser.parse_args()
    result = asyncio.run(bound(args.quick, args.max_devices, args.per_driver))
    print_row(result, args.json)


if __name__ == "__main__":
    main()

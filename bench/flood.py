"""A hostile driver flooding device lists: devshim's peak memory and another resource's Allocate.

Usage: python -m bench.flood [--quick] [--json FILE], or the row ``listflood`` of
``python -m bench`` (a minute and a half, most of it flooding). devshim runs two
drivers, the sim (8 devices, per-call grants: each Allocate a round trip to it) and
tests/support/drivers/hostile_lists.py, which once a second sends ``devices_changed`` with as
many devices as its control file says. Each flood runs in a devshim of its own after a quiet phase
there; every phase times Allocate on the sim's resource every 20 ms and takes devshim's peak RSS
(VmHWM, reset at the phase's start):

- quiet: the hostile driver sends nothing;
- at the bound: lists of the most devices a list may hold, with NVIDIA-like 40-character IDs,
  one device's health flipping each time, so devshim builds, publishes, encodes and saves each;
- oversized: the review's attack, 700,000 short IDs (25 MB), each refused at the byte bound and
  the driver restarted; its restart policy (``stable_after_s`` 0.5) lets it flood again a
  second later instead of backing off, the worst case.

No fake kubelet: a raw ListAndWatch stream on each resource takes devshim's lists as bytes, so
the client's own parsing of 100,000-device lists does not slow the Allocates it times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.common import (
    ROOT,
    Result,
    percentile,
    print_row,
    ratio,
    running,
    sim_command,
    start_devshim,
    workdir,
)
from bench.memory import rss_mb
from shim.driverhost.limits import MAX_DEVICES_PER_LIST
from shim.generated.v1beta1 import api_pb2 as pb

SIM = "example.com/sim-call"
HOSTILE = "example.com/hostile"
DRIVER = ROOT / "tests" / "support" / "drivers" / "hostile_lists.py"
DEPLOY_LIMIT_MB = 256 * 1024 * 1024 / 1e6  # deploy/base/daemonset.yaml: limits.memory 256Mi
ALLOCATE = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["dev1"])])
PACE_S = 0.02
GPU = "GPU-00000000-0000-4000-8000-"  # and 12 digits: 40 characters, like NVIDIA's IDs


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise LookupError(f"no VmHWM for {pid}")


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux 4.0+)


def config(work: Path, control: Path, id_prefix: str) -> Path:
    drivers = [
        {
            "name": "sim",
            "user": "root",
            "command": sim_command(
                work, [{"name": SIM, "count": 8, "id_prefix": "dev", "grant_mode": "per_call"}]
            ),
            "resources": [SIM],
        },
        {
            "name": "hostile",
            "user": "root",
            "command": [sys.executable, str(DRIVER)],
            "env": {
                "RUN_FILE": str(work / "runs"),
                "HOSTILE_MODE": "flood",
                "HOSTILE_FLOOD_FILE": str(control),
                "HOSTILE_ID_PREFIX": id_prefix,
            },
            "restart": {"stable_after_s": 0.5},
            "resources": [HOSTILE],
            "policy": {"envs": ["HOSTILE"]},
        },
    ]
    path = work / "devshim.yaml"
    path.write_text(yaml.safe_dump({"drivers": drivers}))
    return path


async def socket_of(plugin_dir: Path, resource: str) -> Path:
    prefix = "devshim-" + resource.replace("/", "_")
    async with asyncio.timeout(60):
        while not (found := sorted(plugin_dir.glob(f"{prefix}-*.sock"))):
            await asyncio.sleep(0.05)
    return found[0]


@contextlib.asynccontextmanager
async def watching(channel: grpc.aio.Channel) -> AsyncIterator[list[float]]:
    """A raw ListAndWatch stream: the time each list arrived, never parsed."""
    arrivals: list[float] = []

    async def follow() -> None:
        async for _ in channel.unary_stream("/v1beta1.DevicePlugin/ListAndWatch", None, None)(b""):
            arrivals.append(time.monotonic())

    task = asyncio.create_task(follow())
    try:
        yield arrivals
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await task


async def phase(pid: int, allocate: Any, seconds: float) -> dict[str, float]:
    """Allocate every PACE_S for ``seconds``: p50/p99 in ms, failures, devshim's peak RSS."""
    reset_peak(pid)
    samples: list[float] = []
    failed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        try:
            await allocate(ALLOCATE.SerializeToString(), timeout=30)
        except grpc.aio.AioRpcError:
            failed += 1
        samples.append(time.perf_counter() - start)
        await asyncio.sleep(max(0.0, PACE_S - (time.perf_counter() - start)))
    return {
        "p50_ms": round(percentile(samples, 50) * 1000, 2),
        "p99_ms": round(percentile(samples, 99) * 1000, 2),
        "max_ms": round(max(samples) * 1000, 1),
        "n": len(samples),
        "failed": failed,
        "peak_rss_mb": peak_mb(pid),
    }


@dataclass
class Instance:
    pid: int
    control: Path  # the hostile driver's device count
    runs: Path  # one "start" line per run of it
    allocate: Any  # a raw Allocate on the sim's resource
    lists: list[float]  # arrivals of the hostile resource's lists


@contextlib.asynccontextmanager
async def instance(work: Path, id_prefix: str) -> AsyncIterator[Instance]:
    """A fresh devshim serving both drivers, both lists received, Allocate warmed up."""
    control, plugin_dir = work / "flood", work / "dp"
    plugin_dir.mkdir()
    async with running(await start_devshim(plugin_dir, config=config(work, control, id_prefix))) as devshim:
        sim, hostile = [await socket_of(plugin_dir, r) for r in (SIM, HOSTILE)]
        async with (
            grpc.aio.insecure_channel(f"unix:{sim}") as sim_channel,
            grpc.aio.insecure_channel(f"unix:{hostile}") as hostile_channel,
            watching(sim_channel) as sim_lists,
            watching(hostile_channel) as lists,
        ):
            async with asyncio.timeout(60):  # each driver's devices listed
                while not (sim_lists and lists):
                    await asyncio.sleep(0.05)
            allocate = sim_channel.unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)
            for _ in range(200):  # warm-up
                await allocate(ALLOCATE.SerializeToString(), timeout=30)
            yield Instance(devshim.pid, control, work / "runs", allocate, lists)


async def flooded(run: Instance, devices: int, seconds: float) -> dict[str, float]:
    run.control.write_text(str(devices))
    runs, seen = run.runs.read_text().count("start "), len(run.lists)
    figures = await phase(run.pid, run.allocate, seconds)
    figures["lists"] = len(run.lists) - seen
    figures["restarts"] = run.runs.read_text().count("start ") - runs
    run.control.write_text("0")
    return figures


async def flood(
    quick: bool, bound: int = MAX_DEVICES_PER_LIST, oversized: int = 700_000, id_prefix: str = GPU
) -> Result:
    """Each flood in a devshim of its own, after a quiet phase there (peaks stay apart)."""
    seconds = 8.0 if quick else 20.0
    figures: dict[str, dict[str, float]] = {}
    with workdir() as work:
        for name, devices in (("bound", bound), ("oversized", oversized)):
            (work / name).mkdir()
            # The review's oversized list had short IDs; the lists at the bound are NVIDIA-like.
            async with instance(work / name, id_prefix if name == "bound" else "") as run:
                figures[f"{name}_idle"] = {"rss_mb": rss_mb(run.pid)}
                figures[f"{name}_quiet"] = await phase(run.pid, run.allocate, seconds)
                figures[name] = await flooded(run, devices, seconds)
    quiet, at_bound, over = figures["bound_quiet"], figures["bound"], figures["oversized"]
    # Each flood against the quiet phase of its own devshim.
    ratios = {
        name: ratio(figures[name]["p99_ms"], figures[f"{name}_quiet"]["p99_ms"])
        for name in ("bound", "oversized")
    }
    peak = max(f.get("peak_rss_mb", 0.0) for f in figures.values())
    half = DEPLOY_LIMIT_MB / 2
    misses = [f"{name} p99 {r - 2:.2f}x over" for name, r in ratios.items() if r > 2]
    misses += [f"peak RSS {peak - half:.0f} MB over half the limit"] if peak > half else []
    return Result(
        "hostile driver flooding lists: other resource's Allocate, devshim peak RSS",
        {"p50_ms": quiet["p50_ms"], "p99_ms": quiet["p99_ms"], "peak_rss_mb": quiet["peak_rss_mb"]},
        {
            "at_bound_p50_ms": at_bound["p50_ms"],
            "at_bound_p99_ms": at_bound["p99_ms"],
            "at_bound_peak_rss_mb": at_bound["peak_rss_mb"],
            "oversized_p50_ms": over["p50_ms"],
            "oversized_p99_ms": over["p99_ms"],
            "oversized_peak_rss_mb": over["peak_rss_mb"],
        },
        f"p99 {ratios['bound']}x quiet at the bound, {ratios['oversized']}x oversized; "
        f"peak RSS {peak} MB of the {DEPLOY_LIMIT_MB:.0f} MB limit",
        "p99 ≤ 2x quiet; peak RSS ≤ half the DaemonSet's 256 MiB (drivers share it)",
        not misses,
        ", ".join(misses),
        (
            f"at the bound: {at_bound['lists']:.0f} lists of {bound:,} devices sent on in {seconds:g} s; "
            f"oversized ({oversized:,} devices): {over['restarts']:.0f} driver restarts, "
            f"{over['lists']:.0f} lists sent on (Unhealthy, Healthy again), quiet p99 there "
            f"{figures['oversized_quiet']['p99_ms']} ms; idle RSS {figures['bound_idle']['rss_mb']} MB; "
            f"Allocate failures {quiet['failed']:.0f}/{at_bound['failed']:.0f}/{over['failed']:.0f}"
        ),
        {"phases": figures, "seconds_per_phase": seconds},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 s phases instead of 20 s")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument(
        "--bound", type=int, default=MAX_DEVICES_PER_LIST, help="devices per list at the bound"
    )
    parser.add_argument("--oversized", type=int, default=700_000, help="devices per oversized list")
    parser.add_argument("--id-prefix", default=GPU, help="IDs at the bound: this and 12 digits ('': x<n>)")
    args = parser.parse_args()
    result = asyncio.run(flood(args.quick, args.bound, args.oversized, args.id_prefix))
    print_row(result, args.json)


if __name__ == "__main__":
    main()

"""Row dra_flood: another resource's Allocate while many DRA claims are prepared at once.

Usage: python -m bench.dra_flood [--quick] [--json FILE] [--claims N] [--calls N], or the row
``dra_flood`` of ``python -m bench``. A real kube-apiserver and etcd (release 1.37, as for the
row dra_prepare, whose set-up this reuses) and one ``devshim run`` with the sim serving two
resources: 64 GPUs (per-call grants, pre-start and deallocate declared) as the DRA driver
gpu.example.com's pool, and example.com/other (8 devices, per-call grants, not in the pool) as a
device-plugin resource only. One claim per GPU (claim i allocated gpu-i and reserved, as the
scheduler leaves it) is created before anything is timed. Phases in the same devshim, each timing
v1beta1 Allocate of one example.com/other device every 20 ms through devshim's device-plugin
socket (bench/flood.py's ``phase``: p50/p99, failures, devshim's peak RSS):

- quiet: Allocate alone;
- flood: all the claims prepared at once, by 16 NodePrepareResources calls of 4 claims sent
  together (as a node starting many pods sends them), then all unprepared at once the same way,
  wave after wave for the whole phase. devshim prepares a few claims of a driver at once
  (shim.dra.preparer.CLAIMS_AT_ONCE) and writes its checkpoint and the CDI specs on threads.

One warm-up wave and 200 Allocates go first. Every claim of every wave must be answered with its
GPU and no error (or the row fails). Also reported: claims prepared per second (over the prepare
waves' time), each prepare call's p50/p99, and the CPU each process used per phase.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import TICK_S, Result, cpu_ticks, print_row, ratio, stats_ms, workdir
from bench.dra_prepare import NAMESPACE, SERVICE, SIM, Claim, Setup, make_claim, serving
from bench.flood import ALLOCATE, phase
from shim.compat.realnode import ControlPlane
from shim.dra.preparer import CLAIMS_AT_ONCE
from shim.generated.dra.v1 import api_pb2 as dra_pb

OTHER = "example.com/other"
# Its devices are dev0..dev7: bench.flood.ALLOCATE asks for dev1.
OTHER_SIM: dict[str, Any] = {
    "name": OTHER,
    "count": 8,
    "id_prefix": "dev",
    "grant": {"envs": {"OTHER_DEVICES": "{ids}"}},
}


@dataclass(frozen=True)
class Call:
    """One NodePrepareResources call's claims (uid -> its GPU) and both requests, serialized."""

    devices: dict[str, str]
    prepare: bytes
    unprepare: bytes


@dataclass
class Flood:
    prepare_calls: list[float]  # seconds per NodePrepareResources call
    unprepare_calls: list[float]
    prepare_waves: list[float]  # seconds from a wave's first call sent to its last answer
    unprepare_waves: list[float]


async def dra_flood(quick: bool, claims: int = 64, calls: int = 16) -> Result:
    seconds = 6.0 if quick else 15.0
    gpus = {**SIM, "devices": [{"id": f"gpu-{i}"} for i in range(claims)]}
    with workdir() as folder, ControlPlane(37, folder / "cp") as plane:
        made = [(make_claim(plane, f"flood-{i}", f"gpu-{i}"), f"gpu-{i}") for i in range(claims)]
        batches = [made[i::calls] for i in range(calls)]
        requests = [
            Call(
                {claim.uid: device for claim, device in batch},
                dra_pb.NodePrepareResourcesRequest(claims=_refs(batch)).SerializeToString(),
                dra_pb.NodeUnprepareResourcesRequest(claims=_refs(batch)).SerializeToString(),
            )
            for batch in batches
            if batch
        ]
        async with serving(folder, plane, [gpus, OTHER_SIM], dial=OTHER, both_apis=False) as setup:
            allocate = setup.dp.unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)
            stop = asyncio.Event()
            await _flood(setup, requests, stop, waves=1)  # warm-up
            for _ in range(200):
                await allocate(ALLOCATE.SerializeToString(), timeout=30)
            figures: dict[str, dict[str, float]] = {}
            cpu: dict[str, dict[str, float]] = {}

            before = _ticks(setup)
            figures["quiet"] = await phase(setup.pids["devshim"], allocate, seconds)
            cpu["quiet"] = _cpu_share(setup, before, seconds)

            async def timing() -> dict[str, float]:
                try:
                    return await phase(setup.pids["devshim"], allocate, seconds)
                finally:
                    stop.set()

            before, started = _ticks(setup), time.monotonic()
            async with asyncio.TaskGroup() as group:  # a failed claim cancels the timing
                flooding = group.create_task(_flood(setup, requests, stop))
                timed = group.create_task(timing())
            figures["flood"] = timed.result()
            cpu["flood"] = _cpu_share(setup, before, time.monotonic() - started)
            flood = flooding.result()
    return _result(figures, cpu, flood, claims, len(requests), seconds)


def _refs(batch: list[tuple[Claim, str]]) -> list[dra_pb.Claim]:
    return [dra_pb.Claim(namespace=NAMESPACE, name=c.name, uid=c.uid) for c, _ in batch]


async def _flood(setup: Setup, requests: list[Call], stop: asyncio.Event, waves: int = 0) -> Flood:
    """Waves of every call at once, prepare then unprepare, until ``stop`` (or ``waves`` waves)."""
    prepare = setup.dra.unary_unary(f"/{SERVICE}/NodePrepareResources", None, None)
    unprepare = setup.dra.unary_unary(f"/{SERVICE}/NodeUnprepareResources", None, None)
    flood = Flood([], [], [], [])

    async def one(rpc: Any, request: bytes, samples: list[float]) -> bytes:
        start = time.perf_counter()
        answer: bytes = await rpc(request, timeout=120)
        samples.append(time.perf_counter() - start)
        return answer

    done = 0
    while not stop.is_set() and (waves == 0 or done < waves):
        start = time.perf_counter()
        prepared = await asyncio.gather(*(one(prepare, c.prepare, flood.prepare_calls) for c in requests))
        flood.prepare_waves.append(time.perf_counter() - start)
        start = time.perf_counter()
        undone = await asyncio.gather(*(one(unprepare, c.unprepare, flood.unprepare_calls) for c in requests))
        flood.unprepare_waves.append(time.perf_counter() - start)
        for call, raw, raw_undone in zip(requests, prepared, undone, strict=True):
            answers = dra_pb.NodePrepareResourcesResponse.FromString(raw).claims
            errors = dra_pb.NodeUnprepareResourcesResponse.FromString(raw_undone).claims
            for uid, device in call.devices.items():
                got = [d.device_name for d in answers[uid].devices]
                if answers[uid].error or got != [device]:
                    raise RuntimeError(f"claim {uid} ({device}): prepare answered {answers[uid]}")
                if errors[uid].error:
                    raise RuntimeError(f"claim {uid} ({device}): unprepare: {errors[uid].error}")
        done += 1
    return flood


def _ticks(setup: Setup) -> dict[str, int]:
    """utime + stime of devshim, the driver, kube-apiserver, etcd and this process, in clock ticks."""
    return {name: cpu_ticks(pid) for name, pid in setup.pids.items()}


def _cpu_share(setup: Setup, before: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU since ``before``, in % of one core."""
    after = _ticks(setup)
    return {name: round((after[name] - before[name]) * TICK_S / seconds * 100, 1) for name in before}


def _result(
    figures: dict[str, dict[str, float]],
    cpu: dict[str, dict[str, float]],
    flood: Flood,
    claims: int,
    calls: int,
    seconds: float,
) -> Result:
    quiet, flooded = figures["quiet"], figures["flood"]
    p99, p50 = ratio(flooded["p99_ms"], quiet["p99_ms"]), ratio(flooded["p50_ms"], quiet["p50_ms"])
    waves = len(flood.prepare_waves)
    per_s = round(claims * waves / sum(flood.prepare_waves), 1)
    prepare, unprepare = stats_ms(flood.prepare_calls), stats_ms(flood.unprepare_calls)
    prepare_wave, unprepare_wave = stats_ms(flood.prepare_waves), stats_ms(flood.unprepare_waves)
    failed = quiet["failed"] + flooded["failed"]
    misses = [f"{p99 - 2:.2f}x over"] if p99 > 2 else []
    misses += [f"{failed:.0f} Allocates failed"] if failed else []
    shares = "; ".join(
        f"{phase_} " + "/".join(f"{v:g}" for v in each.values()) for phase_, each in cpu.items()
    )
    return Result(
        "dra_flood: other resource's Allocate during a DRA prepare flood",
        {"p50_ms": quiet["p50_ms"], "p99_ms": quiet["p99_ms"]},
        {
            "p50_ms": flooded["p50_ms"],
            "p99_ms": flooded["p99_ms"],
            "claims_per_s": per_s,
            "prepare_p50_ms": prepare["p50_ms"],
            "prepare_p99_ms": prepare["p99_ms"],
        },
        f"p99 {p99}x quiet (p50 {p50}x)",
        "other resource's Allocate p99 ≤ 2x quiet during a DRA prepare flood",
        not misses,
        ", ".join(misses),
        (
            f"{claims} claims (one GPU each) prepared by {calls} NodePrepareResources calls at once, "
            f"then unprepared the same way: {waves} waves in {seconds:g} s, no claim error; "
            f"devshim prepares at most {CLAIMS_AT_ONCE} at once. A wave prepared in p50 "
            f"{prepare_wave['p50_ms']:.0f} ms, unprepared in p50 {unprepare_wave['p50_ms']:.0f} ms; "
            f"unprepare call p50 {unprepare['p50_ms']:.0f} ms, p99 {unprepare['p99_ms']:.0f} ms. "
            f"Allocate max {quiet['max_ms']}/{flooded['max_ms']} ms, {quiet['n']:.0f}/{flooded['n']:.0f} "
            f"calls, failures {quiet['failed']:.0f}/{flooded['failed']:.0f}; devshim peak RSS "
            f"{quiet['peak_rss_mb']}/{flooded['peak_rss_mb']} MB (quiet/flood). CPU, % of a core, "
            f"{'/'.join(next(iter(cpu.values())))}: {shares}."
        ),
        {
            "phases": figures,
            "cpu_percent": cpu,
            "claims": claims,
            "calls": calls,
            "waves": waves,
            "prepare_call": prepare,
            "unprepare_call": unprepare,
            "prepare_wave": prepare_wave,
            "unprepare_wave": unprepare_wave,
            "seconds_per_phase": seconds,
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 s phases instead of 15 s")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--claims", type=int, default=64, help="claims (and GPUs) in a wave (default 64)")
    parser.add_argument("--calls", type=int, default=16, help="prepare calls a wave (default 16)")
    args = parser.parse_args()
    if args.claims < 1 or not 1 <= args.calls <= args.claims:
        parser.error("--claims at least 1, --calls from 1 to --claims")
    result = asyncio.run(dra_flood(args.quick, args.claims, args.calls))
    print_row(result, args.json)


if __name__ == "__main__":
    main()

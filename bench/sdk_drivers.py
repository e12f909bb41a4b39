"""Rows sdk_rss and sdk_allocate: a driver written with the Go SDK beside the same on the Python SDK.

sdk_rss: VmRSS of each driver once idle, spawned as devshim spawns a driver (its stdin and stdout
pipes), asked ``initialize`` and ``list_devices`` over its stdin as devshim asks at start, then
read from /proc/PID/status once it has settled (unchanged over SETTLE_READS reads SETTLE_EVERY_S
apart): the Go FPGA example (examples/go-fpga), docs/sdk.md's fans driver in Go
(sdk/go/internal/fans) and on the Python SDK (adapters/examples/python_minimal.py), beside the
floor of a Go program that does nothing but wait for its stdin to end (EMPTY_GO, built in a
temporary folder).

sdk_allocate: Allocate of one device through `devshim run`, one devshim serving each fans driver
(the same driver in each SDK, the same grant), each registered with a fake kubelet; one raw
grpc.aio client sends both the same request bytes in alternating rounds. The CPU each driver
process spends per call comes from /proc/PID/stat (utime + stime) over the timed calls.
The Go programs are built with the machine's Go, cached by source (tests/conformance/builds.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from bench.common import (
    ROOT,
    TICK_S,
    Result,
    children,
    cpu_ticks,
    interleaved,
    ratio,
    running,
    start_devshim,
    stats_ms,
    workdir,
    write_config,
)
from bench.memory import rss_mb
from shim.compat.fakekubelet import FakeKubelet
from shim.driverprotocol import PROTOCOL_VERSION
from shim.generated.v1beta1 import api_pb2 as pb
from tests.conformance.builds import built

RESOURCE = "example.com/fan"  # the fans driver's, in both SDKs
FPGA = "example.com/fpga"
PYTHON_FANS = [sys.executable, str(ROOT / "adapters" / "examples" / "python_minimal.py")]
RSS_GOAL_MB = 10.0
ALLOCATE_GOAL = 1.1  # Go p50 / Python p50
SETTLE_READS = 5
SETTLE_EVERY_S = 0.1
SETTLE_LIMIT_S = 10.0
ANSWER_TIMEOUT_S = 30.0
# The least a Go driver is: a program that blocks reading its stdin until it ends (a bare
# `select {}` is no floor: the runtime sees every goroutine asleep and exits, "deadlock!").
EMPTY_GO = """package main

import "os"

func main() {
	buf := make([]byte, 1)
	for {
		if _, err := os.Stdin.Read(buf); err != nil {
			return
		}
	}
}
"""
ALLOCATE = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["fan1"])])


def go_programs() -> dict[str, Path]:
    """The Go FPGA example and the Go fans driver, from the cache or built now."""
    return {name: built(name) for name in ("go-fpga", "go-fans")}


def empty_go(folder: Path) -> Path:
    """The floor: a Go program that only blocks, built with the same flags as the drivers."""
    (folder / "main.go").write_text(EMPTY_GO)
    (folder / "go.mod").write_text("module example.com/empty\n\ngo 1.26\n")
    binary = folder / "empty"
    env = {**os.environ, "GOWORK": "off", "CGO_ENABLED": "0"}
    subprocess.run(
        ["go", "build", "-trimpath", "-buildvcs=false", "-o", str(binary), "."],
        cwd=folder, env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return binary


async def _ask(proc: asyncio.subprocess.Process, ident: int, method: str, params: dict[str, Any]) -> None:
    """One request on the driver's stdin; its answer (notifications before it are skipped)."""
    assert proc.stdin is not None and proc.stdout is not None
    request = {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    await proc.stdin.drain()
    async with asyncio.timeout(ANSWER_TIMEOUT_S):
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{method}: the driver closed its stdout (exit {await proc.wait()})")
            answer = json.loads(line)
            if answer.get("id") == ident:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return


async def settled_rss_mb(pid: int) -> float:
    """VmRSS once SETTLE_READS reads in a row agree (the start-up's garbage freed, pages touched)."""
    reads: list[float] = []
    async with asyncio.timeout(SETTLE_LIMIT_S):
        while len(reads) < SETTLE_READS or len(set(reads[-SETTLE_READS:])) > 1:
            reads.append(rss_mb(pid))
            await asyncio.sleep(SETTLE_EVERY_S)
    return reads[-1]


async def idle_rss_mb(argv: list[str], resource: str | None, env: dict[str, str] | None = None) -> float:
    """A driver's settled RSS after initialize and list_devices of ``resource`` (None: a program
    that speaks no protocol, spawned alike), with ``env`` its whole environment."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=tempfile.gettempdir(),
        env=env or {},  # a driver gets exactly its entry's env
    )
    async with running(proc):
        if resource is not None:
            await _ask(proc, 1, "initialize", {"protocol_version": PROTOCOL_VERSION})
            await _ask(proc, 2, "list_devices", {"resource": resource})
        return await settled_rss_mb(proc.pid)


async def sdk_rss(quick: bool) -> Result:
    programs = await asyncio.to_thread(go_programs)
    with workdir() as work:
        floor = await idle_rss_mb([str(await asyncio.to_thread(empty_go, work))], None)
        # As its devshim.yaml runs it: polling a folder for health reports.
        reports = work / "fpga-reports"
        reports.mkdir()
        fpga = await idle_rss_mb([str(programs["go-fpga"])], FPGA, {"FPGA_REPORT_DIR": str(reports)})
        go_fans = await idle_rss_mb([str(programs["go-fans"])], RESOURCE)
        python_fans = await idle_rss_mb(PYTHON_FANS, RESOURCE)
    met = fpga <= RSS_GOAL_MB
    return Result(
        "idle RSS: a Go SDK driver beside the same on the Python SDK",
        {"empty_go_mb": floor, "python_fans_mb": python_fans},
        {"go_fpga_mb": fpga, "go_fans_mb": go_fans},
        f"Go FPGA example {fpga} MB ({fpga - floor:+.1f} over an empty Go program); fans: Go "
        f"{go_fans} MB, Python {python_fans} MB ({ratio(python_fans, go_fans)}x Go)",
        f"Go example driver ≤ {RSS_GOAL_MB:g} MB",
        met,
        "" if met else f"{fpga - RSS_GOAL_MB:.1f} MB over",
        "each spawned with pipes, asked initialize and list_devices on its stdin, VmRSS once "
        f"{SETTLE_READS} reads {SETTLE_EVERY_S:g} s apart agree; floor: a Go program reading its stdin",
    )


@contextlib.asynccontextmanager
async def serving(work: Path, name: str, command: list[str]) -> AsyncIterator[tuple[grpc.aio.Channel, int]]:
    """`devshim run` with the fans driver ``command``, registered: a raw channel to its socket and
    the driver's pid."""
    plugin_dir = work / name
    entry = {"user": "root", "command": command, "resources": [RESOURCE], "policy": {"envs": ["FANS"]}}
    config = write_config(work / f"{name}.yaml", {name: entry})
    async with (
        FakeKubelet(plugin_dir) as kubelet,
        running(await start_devshim(plugin_dir, config=config)) as devshim,
    ):
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=60)
        await session.wait_for_list(timeout=60)
        (driver,) = children(devshim.pid)
        channel = grpc.aio.insecure_channel(f"unix:{plugin_dir / session.endpoint}")
        try:
            yield channel, driver
        finally:
            await channel.close(None)


def counts(quick: bool) -> tuple[int, int, int]:
    """calls per arm, rounds, warm-up calls"""
    return (300, 3, 30) if quick else (3000, 10, 200)


async def sdk_allocate(quick: bool) -> Result:
    fans = await asyncio.to_thread(built, "go-fans")
    payload = ALLOCATE.SerializeToString()
    calls, rounds, warmup = counts(quick)
    with workdir() as work:
        async with (
            serving(work, "go", [str(fans)]) as (go_channel, go_pid),
            serving(work, "python", PYTHON_FANS) as (py_channel, py_pid),
        ):
            rpcs = {
                name: channel.unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)
                for name, channel in (("go", go_channel), ("python", py_channel))
            }
            for name, rpc in rpcs.items():  # each driver answers, and with the same grant
                reply = pb.AllocateResponse.FromString(await rpc(payload, timeout=10))
                envs = dict(reply.container_responses[0].envs)
                if envs.get("FANS") != "fan1":
                    raise RuntimeError(f"the {name} fans driver granted {envs}, not FANS=fan1")
            arms = {name: (lambda rpc=rpc: rpc(payload, timeout=10)) for name, rpc in rpcs.items()}
            before = {name: cpu_ticks(pid) for name, pid in (("go", go_pid), ("python", py_pid))}
            samples = await interleaved(arms, calls, rounds, warmup)
            spent = {"go": cpu_ticks(go_pid) - before["go"], "python": cpu_ticks(py_pid) - before["python"]}
    made = {name: 1 + warmup + len(samples[name]) for name in samples}  # every call it answered
    cpu_us = {name: round(spent[name] * TICK_S / made[name] * 1e6) for name in spent}
    go, python = stats_ms(samples["go"]), stats_ms(samples["python"])
    r50, r99 = ratio(go["p50_ms"], python["p50_ms"]), ratio(go["p99_ms"], python["p99_ms"])
    met = r50 <= ALLOCATE_GOAL
    return Result(
        "Allocate through devshim: Go SDK driver vs Python SDK driver (fans)",
        {
            "python p50_ms": python["p50_ms"],
            "python p99_ms": python["p99_ms"],
            "python cpu_us": cpu_us["python"],
        },
        {"go p50_ms": go["p50_ms"], "go p99_ms": go["p99_ms"], "go cpu_us": cpu_us["go"]},
        f"Go/Python p50 {r50}x, p99 {r99}x; driver CPU per call Go {cpu_us['go']} µs, Python "
        f"{cpu_us['python']} µs",
        f"Go p50 ≤ {ALLOCATE_GOAL:g}x Python",
        met,
        "" if met else f"{r50 - ALLOCATE_GOAL:.2f}x over",
        f"{len(samples['go'])} calls each in {rounds} alternating rounds after {warmup} warm-up calls, "
        "one devshim per driver; CPU: the driver process's utime + stime over all its calls",
        {"go": go, "python": python, "driver_cpu_us_per_call": cpu_us},
    )

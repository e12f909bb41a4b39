"""Rows 1-3: Allocate and GetPreferredAllocation through devshim beside a bare grpc.aio echo.

devshim (with the sim driver, a subprocess behind the JSON-RPC pipe) and the
echo (bench/echo_server.py, answering with devshim's own reply bytes) run in
their own processes on unix sockets; one raw grpc.aio client sends both the
same request bytes in alternating rounds, so the ratio is devshim's own cost.
Rows 1 and 3 also time the floor of any design with a driver behind a pipe:
the echo making one round trip to a child that copies lines with blocking reads,
and say the CPU each process spends per call (the two sides of a pipe take turns,
so CPU a side spends is time the call waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
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
    sim_driver,
    start_devshim,
    stats_ms,
    workdir,
    write_config,
)
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.generated.v1beta1 import api_pb2 as pb

DECLARED = "example.com/sim-declared"
PER_CALL = "example.com/sim-call"
NUMA = "example.com/sim-numa"
GRANT = {
    "envs": {"BENCH": "{ids}"},
    "device_nodes": [{"container_path": "/dev/b{id}", "host_path": "/dev/null"}],
}
# 64 devices, 16 on each of 4 NUMA nodes; the kubelet offers them interleaved across nodes and
# must include one on node 2, so the sim's rule (must_include, then its NUMA neighbours) picks
# the 8 from node 2.
NUMA_IDS = [f"gpu{i}" for i in range(64)]
AVAILABLE = sorted(NUMA_IDS, key=lambda i: (int(i[3:]) % 16, int(i[3:])))
MUST_INCLUDE = ["gpu33"]
ALLOCATE = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["dev1"])])
PREFERRED = pb.PreferredAllocationRequest(
    container_requests=[
        pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=AVAILABLE, must_include_deviceIDs=MUST_INCLUDE, allocation_size=8
        )
    ]
)


def sim_resources() -> list[dict[str, Any]]:
    common = {"count": 8, "id_prefix": "dev", "grant": GRANT}
    numa = [{"id": i, "numa_nodes": [int(i[3:]) // 16]} for i in NUMA_IDS]
    return [
        {"name": DECLARED, "grant_mode": "declared", **common},
        {"name": PER_CALL, "grant_mode": "per_call", **common},
        {"name": NUMA, "devices": numa, "preferred_allocation": True, "grant": GRANT},
    ]


@dataclass
class Setup:
    sessions: dict[str, PluginSession]
    devshim: dict[str, grpc.aio.Channel]  # resource -> a raw channel to its socket
    echo: grpc.aio.Channel
    floor: grpc.aio.Channel  # the echo with one pipe round trip per call
    pids: dict[str, int]  # devshim, echo, floor: the serving process of each arm

    @staticmethod
    def call(channel: grpc.aio.Channel, method: str, payload: bytes) -> Callable[[], Awaitable[bytes]]:
        """A raw call: request bytes in, reply bytes out, no (de)serialization."""
        rpc = channel.unary_unary(f"/v1beta1.DevicePlugin/{method}", None, None)
        return lambda: rpc(payload, timeout=10)


@contextlib.asynccontextmanager
async def serving(work: Path) -> AsyncIterator[Setup]:
    """devshim serving the three sim resources to a fake kubelet, and an echo of its replies."""
    plugin_dir = work / "dp"
    config = write_config(work / "devshim.yaml", {"sim": sim_driver(work, sim_resources())})
    async with (
        FakeKubelet(plugin_dir) as kubelet,
        running(await start_devshim(plugin_dir, config=config)) as devshim,
    ):
        names = (DECLARED, PER_CALL, NUMA)
        sessions = {r: await kubelet.wait_for_plugin(r, timeout=60) for r in names}
        for session in sessions.values():
            await session.wait_for_list()
        channels = {
            r: grpc.aio.insecure_channel(f"unix:{plugin_dir / s.endpoint}") for r, s in sessions.items()
        }
        allocate = ALLOCATE.SerializeToString()
        preferred = PREFERRED.SerializeToString()
        replies = {
            "Allocate": await Setup.call(channels[PER_CALL], "Allocate", allocate)(),
            "GetPreferredAllocation": await Setup.call(channels[NUMA], "GetPreferredAllocation", preferred)(),
        }
        async with (
            echo_server(work / "echo.sock", replies) as (echo, echo_pid),
            echo_server(work / "floor.sock", replies, pipe_hop=True) as (floor, floor_pid),
        ):
            pids = {"devshim": devshim.pid, "echo": echo_pid, "floor": floor_pid}
            try:
                yield Setup(sessions, channels, echo, floor, pids)
            finally:
                for channel in channels.values():
                    await channel.close(None)


@contextlib.asynccontextmanager
async def echo_server(
    path: Path, replies: dict[str, bytes], pipe_hop: bool = False
) -> AsyncIterator[tuple[grpc.aio.Channel, int]]:
    """bench/echo_server.py answering ``replies`` on ``path``, in its own process; a channel to
    it, and its pid."""
    args = [*(["--pipe-hop"] if pipe_hop else []), str(path)]
    args += [f"{method}={reply.hex()}" for method, reply in replies.items()]
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.echo_server", *args, cwd=ROOT)
    async with running(proc):
        channel = grpc.aio.insecure_channel(f"unix:{path}")
        try:
            async with asyncio.timeout(10):
                await channel.channel_ready()
            yield channel, proc.pid
        finally:
            await channel.close(None)


def judge(
    name: str, results: dict[str, list[float]], goal50: float, goal99: float | None, goal: str
) -> Result:
    base, ours = stats_ms(results["echo"]), stats_ms(results["devshim"])
    r50, r99 = ratio(ours["p50_ms"], base["p50_ms"]), ratio(ours["p99_ms"], base["p99_ms"])
    misses = [f"p50 {r50 - goal50:.2f}x over"] if r50 > goal50 else []
    if goal99 is not None and r99 > goal99:
        misses.append(f"p99 {r99 - goal99:.2f}x over")
    extra: dict[str, Any] = {"n": base["n"]}
    note = ""
    if "floor" in results:
        # The least a pipe round trip adds: how much of the gap any driver subprocess would cost.
        floor = stats_ms(results["floor"])
        f50, over = ratio(floor["p50_ms"], base["p50_ms"]), ratio(ours["p50_ms"], floor["p50_ms"])
        extra["floor"] = floor
        note = (
            f"floor (echo + one blocking pipe round trip): p50 {floor['p50_ms']} ms = {f50}x echo, "
            f"p99 {floor['p99_ms']} ms; devshim p50 = {over}x the floor"
        )
    return Result(
        name, base, ours, f"p50 {r50}x, p99 {r99}x", goal, not misses, "; ".join(misses), note, extra
    )


async def cpu_per_call(s: Setup, method: str, payload: bytes, devshim: grpc.aio.Channel, calls: int) -> str:
    """Microseconds of CPU per call of each process on each path, ``calls`` calls each in turn."""
    paths = {
        "echo": (s.echo, [s.pids["echo"]]),
        "floor": (s.floor, [s.pids["floor"], *children(s.pids["floor"])]),
        "devshim": (devshim, [s.pids["devshim"], *children(s.pids["devshim"])]),
    }
    said = []
    for name, (channel, pids) in paths.items():
        call = s.call(channel, method, payload)
        before = [cpu_ticks(pid) for pid in pids]
        for _ in range(calls):
            await call()
        spent = [cpu_ticks(pid) - b for pid, b in zip(pids, before, strict=True)]
        used = [round(ticks * TICK_S / calls * 1e6) for ticks in spent]
        said.append(f"{name} {' + '.join(map(str, used))}")
    return "CPU µs per call (server + pipe peer): " + ", ".join(said)


def counts(quick: bool) -> tuple[int, int, int]:
    """calls per arm, rounds, warm-up calls"""
    return (400, 4, 50) if quick else (3000, 10, 200)


async def allocate_per_call(quick: bool) -> Result:
    """Row 1: Allocate of one device, the sim answering allocate over the pipe."""
    with workdir() as work:
        async with serving(work) as s:
            payload = ALLOCATE.SerializeToString()
            arms = {
                "echo": s.call(s.echo, "Allocate", payload),
                "devshim": s.call(s.devshim[PER_CALL], "Allocate", payload),
                "floor": s.call(s.floor, "Allocate", payload),
                "fake kubelet": lambda: s.sessions[PER_CALL].allocate(["dev1"]),
            }
            results = await interleaved(arms, *counts(quick))
            cpu = await cpu_per_call(s, "Allocate", payload, s.devshim[PER_CALL], counts(quick)[0])
    row = judge("Allocate, per-call sim driver", results, 1.3, 1.5, "p50 ≤ 1.3x, p99 ≤ 1.5x echo")
    via = stats_ms(results["fake kubelet"])
    row.extra["via_fake_kubelet"] = via
    row.note += f"; through the fake kubelet's client: p50 {via['p50_ms']} ms, p99 {via['p99_ms']} ms; {cpu}"
    return row


async def allocate_declared(quick: bool) -> Result:
    """Row 2: Allocate of one device whose grant the sim declared in its list (no pipe hop)."""
    with workdir() as work:
        async with serving(work) as s:
            payload = ALLOCATE.SerializeToString()
            arms = {
                "echo": s.call(s.echo, "Allocate", payload),
                "devshim": s.call(s.devshim[DECLARED], "Allocate", payload),
            }
            results = await interleaved(arms, *counts(quick))
    return judge("Allocate, declared grants", results, 1.1, None, "p50 ≤ 1.1x echo")


async def preferred_allocation(quick: bool) -> Result:
    """Row 3: GetPreferredAllocation, 8 of 64 devices on 4 NUMA nodes, asked of the sim."""
    with workdir() as work:
        async with serving(work) as s:
            payload = PREFERRED.SerializeToString()
            chosen = await s.sessions[NUMA].preferred_allocation(AVAILABLE, MUST_INCLUDE, 8)
            arms = {
                "echo": s.call(s.echo, "GetPreferredAllocation", payload),
                "devshim": s.call(s.devshim[NUMA], "GetPreferredAllocation", payload),
                "floor": s.call(s.floor, "GetPreferredAllocation", payload),
            }
            results = await interleaved(arms, *counts(quick))
            cpu = await cpu_per_call(s, "GetPreferredAllocation", payload, s.devshim[NUMA], counts(quick)[0])
    row = judge("GetPreferredAllocation, 8 of 64 on 4 NUMA", results, 1.3, None, "p50 ≤ 1.3x echo")
    nodes = sorted({int(i[3:]) // 16 for i in chosen})
    row.note += f"; the sim chose {len(chosen)} devices on NUMA node(s) {nodes}; {cpu}"
    return row

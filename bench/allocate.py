"""Allocate latency through devshim beside a bare grpc.aio echo, in one run.

devshim and the echo run in their own processes on unix sockets in one temp
dir; every row is measured in alternating rounds so machine noise hits all
alike. Rows:
  echo (raw client)           the floor: a grpc.aio server returning fixed bytes
  static (raw client)         the same client against devshim's static source
  static (fake kubelet)       the fake kubelet's Allocate call (its own translation included)
  sim declared (fake kubelet) a sim driver resource with declared grants: no driver round trip
  sim per-call (fake kubelet) a sim driver resource answering allocate over the JSON-RPC pipe

Usage: python -m bench.allocate [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import yaml

from bench.common import percentile, start_devshim, stop, summary_ms
from shim.generated.v1beta1 import api_pb2 as pb
from tests.compat.kubelet import FakeKubelet, PluginSession

STATIC = "example.com/bench"
DECLARED = "example.com/sim-declared"
PER_CALL = "example.com/sim-call"
GRANT = {
    "envs": {"BENCH": "{ids}"},
    "device_nodes": [{"container_path": "/dev/b{id}", "host_path": "/dev/b{id}"}],
}


def devshim_config(workdir: Path) -> Path:
    sim = workdir / "sim.yaml"
    sim.write_text(
        yaml.safe_dump(
            {
                "resources": [
                    {
                        "name": DECLARED,
                        "count": 8,
                        "id_prefix": "dev",
                        "grant_mode": "declared",
                        "grant": GRANT,
                    },
                    {
                        "name": PER_CALL,
                        "count": 8,
                        "id_prefix": "dev",
                        "grant_mode": "per_call",
                        "grant": GRANT,
                    },
                ]
            }
        )
    )
    config = workdir / "devshim.yaml"
    command = [sys.executable, "-m", "devshim_adapters.sim", "--config", str(sim)]
    drivers = [{"name": "sim", "command": command}]
    config.write_text(yaml.safe_dump({"state_dir": str(workdir / "state"), "drivers": drivers}))
    return config


Call = Callable[[], Awaitable[object]]


async def timed(call: Call, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


def kubelet_call(session: PluginSession) -> Call:
    return lambda: session.allocate(["dev1"])


async def main(calls: int, rounds: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="ds-bench-", dir="/tmp"))
    plugin_dir = workdir / "dp"
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["dev1"])])
    payload = request.SerializeToString()
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    devshim = await start_devshim(plugin_dir, f"{STATIC}=8", config=devshim_config(workdir))
    echo = None
    try:
        sessions = {r: await kubelet.wait_for_plugin(r, timeout=60) for r in (STATIC, DECLARED, PER_CALL)}
        for session in sessions.values():
            await session.wait_for_list()
        raw_devshim = grpc.aio.insecure_channel(f"unix:{plugin_dir / sessions[STATIC].endpoint}")
        raw_allocate = raw_devshim.unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)
        reply = await raw_allocate(payload)
        # The echo answers with devshim's own reply bytes, so both move the same payload.
        echo_path = workdir / "echo.sock"
        echo = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("echo_server.py")), str(echo_path), reply.hex()
        )
        raw_echo = grpc.aio.insecure_channel(f"unix:{echo_path}")
        await asyncio.wait_for(raw_echo.channel_ready(), 10)
        echo_allocate = raw_echo.unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)
        rows: dict[str, Call] = {
            "echo (raw client)": lambda: echo_allocate(payload, timeout=10),
            "static (raw client)": lambda: raw_allocate(payload, timeout=10),
            "static (fake kubelet)": kubelet_call(sessions[STATIC]),
            "sim declared (fake kubelet)": kubelet_call(sessions[DECLARED]),
            "sim per-call (fake kubelet)": kubelet_call(sessions[PER_CALL]),
        }
        results: dict[str, list[float]] = {name: [] for name in rows}
        for call in rows.values():
            await timed(call, 200)
        for _ in range(rounds):
            for name, call in rows.items():
                results[name] += await timed(call, calls // rounds)
        await raw_echo.close(None)
        await raw_devshim.close(None)
    finally:
        if echo is not None:
            await stop(echo)
        await stop(devshim)
        await kubelet.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"Allocate of 1 device, {calls} calls per row in {rounds} alternating rounds, unix sockets")
    for name, samples in results.items():
        print(f"  {name:28s} {summary_ms(samples)}")
    floor = results["echo (raw client)"]
    for name in list(rows)[1:]:
        p50 = statistics.median(results[name]) / statistics.median(floor)
        p99 = percentile(results[name], 99) / percentile(floor, 99)
        print(f"  {name:28s} / echo: p50 {p50:.2f}x, p99 {p99:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))

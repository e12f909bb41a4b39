"""Allocate latency through devshim beside a bare grpc.aio echo, in one run.

Both servers run in their own processes on unix sockets in one temp dir; one
client measures them in alternating rounds so machine noise hits both alike.
Rows:
  echo (raw client)      the floor: a grpc.aio server returning fixed bytes
  devshim (raw client)   the same client, calling devshim's real Allocate
  devshim (fake kubelet) the fake kubelet's admission call (its own translation included)

Usage: python bench/allocate.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.common import percentile, start_devshim, stop, summary_ms
from shim.generated.v1beta1 import api_pb2 as pb
from tests.compat.kubelet import FakeKubelet, PluginSession

RESOURCE = "example.com/bench"


async def timed_raw(channel: grpc.aio.Channel, request: bytes, calls: int) -> list[float]:
    call = channel.unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        await call(request, timeout=10)
        samples.append(time.perf_counter() - start)
    return samples


async def timed_kubelet(session: PluginSession, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        await session.allocate(["dev1"])
        samples.append(time.perf_counter() - start)
    return samples


async def main(calls: int, rounds: int) -> None:
    plugin_dir = Path(tempfile.mkdtemp(prefix="ds-bench-", dir="/tmp"))
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["dev1"])])
    echo_path = plugin_dir / "echo.sock"
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    devshim = await start_devshim(plugin_dir, f"{RESOURCE}=8")
    try:
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=30)
        await session.wait_for_list()
        # The echo answers with devshim's own reply bytes, so both move the same payload.
        raw_devshim = grpc.aio.insecure_channel(f"unix:{plugin_dir / session.endpoint}")
        reply = await raw_devshim.unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)(
            request.SerializeToString()
        )
        echo = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("echo_server.py")), str(echo_path), reply.hex()
        )
        raw_echo = grpc.aio.insecure_channel(f"unix:{echo_path}")
        await asyncio.wait_for(raw_echo.channel_ready(), 10)
        payload = request.SerializeToString()
        results: dict[str, list[float]] = {
            "echo (raw client)": [],
            "devshim (raw client)": [],
            "devshim (fake kubelet)": [],
        }
        for warm in (raw_echo, raw_devshim):
            await timed_raw(warm, payload, 200)
        await timed_kubelet(session, 200)
        for _ in range(rounds):
            results["echo (raw client)"] += await timed_raw(raw_echo, payload, calls // rounds)
            results["devshim (raw client)"] += await timed_raw(raw_devshim, payload, calls // rounds)
            results["devshim (fake kubelet)"] += await timed_kubelet(session, calls // rounds)
        await raw_echo.close(None)
        await raw_devshim.close(None)
        echo.terminate()
        await echo.wait()
    finally:
        await stop(devshim)
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    print(f"Allocate of 1 device, {calls} calls per row in {rounds} alternating rounds, unix sockets")
    for name, samples in results.items():
        print(f"  {name:24s} {summary_ms(samples)}")
    floor = results["echo (raw client)"]
    for name in ("devshim (raw client)", "devshim (fake kubelet)"):
        p50 = statistics.median(results[name]) / statistics.median(floor)
        p99 = percentile(results[name], 99) / percentile(floor, 99)
        print(f"  {name} / echo: p50 {p50:.2f}x, p99 {p99:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))

"""The baseline of the health row: a bare grpc.aio ListAndWatch that encodes and sends a list.

Serves /v1beta1.DevicePlugin/ListAndWatch on a unix socket with the same
devices bench/driver.py lists, held as one ListAndWatchResponse. Every SIGUSR1
takes CLOCK_MONOTONIC, toggles the first device's health in that message and
sends it once (gRPC serializes all 10k devices), then appends the time to the
stamps file: the floor of telling the kubelet, encode + send, nothing more.
Usage: python -m bench.list_server SOCKET STAMPS COUNT
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from bench.driver import NUMA_NODES, device_ids
from shim.generated.v1beta1 import api_pb2 as pb


def response(devices: list[tuple[str, int]], unhealthy: set[str]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(
        devices=[
            pb.Device(
                ID=i,
                health="Unhealthy" if i in unhealthy else "Healthy",
                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=node)]),
            )
            for i, node in devices
        ]
    )


async def main(path: str, stamps: Path, count: int) -> None:
    message = response([(i, n % NUMA_NODES) for n, i in enumerate(device_ids(count))], set())
    trigger = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, trigger.set)

    async def list_and_watch(request: bytes, context: Any) -> AsyncIterator[pb.ListAndWatchResponse]:
        yield message
        while True:
            await trigger.wait()
            trigger.clear()
            stamp = time.monotonic()
            first = message.devices[0]
            first.health = "Healthy" if first.health == "Unhealthy" else "Unhealthy"
            yield message
            with stamps.open("a") as f:
                f.write(f"{stamp!r}\n")

    handler = grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin",
        {
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                list_and_watch, response_serializer=pb.ListAndWatchResponse.SerializeToString
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))

"""The baseline of the re-registration row: a minimal v1beta1 device plugin polling every 10 ms.

It serves 4 devices on PLUGIN_DIR/minimal.sock and registers them; every
10 ms it stats kubelet.sock and, when the socket's identity (inode, ctime)
changed, re-serves its own socket if the kubelet's cleanup removed it and
calls Register again. No inotify, no backoff: the simplest plugin that
survives kubelet restarts.
Usage: python -m bench.minimal_plugin PLUGIN_DIR RESOURCE
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from shim.generated.v1beta1 import api_pb2 as pb
from shim.generated.v1beta1 import api_pb2_grpc as pb_grpc

POLL_S = 0.01
SOCKET = "minimal.sock"


class Plugin(pb_grpc.DevicePluginServicer):
    async def GetDevicePluginOptions(self, request: Any, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[pb.ListAndWatchResponse]:
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=f"m{i}", health="Healthy") for i in range(4)])
        await asyncio.Event().wait()  # the list never changes


async def serve(path: Path) -> grpc.aio.Server:
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(Plugin(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    return server


async def register(kubelet: Path, resource: str) -> None:
    async with grpc.aio.insecure_channel(f"unix:{kubelet}") as channel:
        request = pb.RegisterRequest(version="v1beta1", endpoint=SOCKET, resource_name=resource)
        stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        await stub.Register(request, timeout=5)


async def main(plugin_dir: Path, resource: str) -> None:
    kubelet, own = plugin_dir / "kubelet.sock", plugin_dir / SOCKET
    server = await serve(own)
    registered: tuple[int, int] | None = None
    while True:
        try:
            st = os.stat(kubelet)
            identity: tuple[int, int] | None = (st.st_ino, st.st_ctime_ns)
        except FileNotFoundError:
            identity = None
        if identity is not None and identity != registered:
            if not own.exists():
                await server.stop(0)
                server = await serve(own)
            try:
                await register(kubelet, resource)
                registered = identity
            except grpc.RpcError:
                pass  # the kubelet is not answering yet: the next poll tries again
        await asyncio.sleep(POLL_S)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))

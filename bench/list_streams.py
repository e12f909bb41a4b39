"""The kubelet's side of the ``bound`` row's lists, in a process of its own.

Usage: python -m bench.list_streams PLUGIN_DIR RESOURCE...: a raw ListAndWatch stream on each
resource's socket, printing the resource's name on a line of its own as each list arrives (never
parsed). A kubelet is another process: taking 2 MB lists in the process that times Allocate
would add the taking to devshim's figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import grpc

from bench.flood import socket_of


async def follow(plugin_dir: Path, name: str) -> None:
    async with grpc.aio.insecure_channel(f"unix:{await socket_of(plugin_dir, name)}") as channel:
        async for _ in channel.unary_stream("/v1beta1.DevicePlugin/ListAndWatch", None, None)(b""):
            print(name, flush=True)


async def main(plugin_dir: Path, names: list[str]) -> None:
    await asyncio.gather(*(follow(plugin_dir, name) for name in names))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt, grpc.aio.AioRpcError):
        asyncio.run(main(Path(sys.argv[1]), sys.argv[2:]))

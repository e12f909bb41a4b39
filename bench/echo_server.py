"""A bare grpc.aio server answering /v1beta1.DevicePlugin/Allocate with a fixed reply.

The floor for Allocate over a unix socket in Python: no translation, no
validation, no device source. Run by bench/allocate.py in its own process.
Usage: python bench/echo_server.py SOCKET_PATH REPLY_HEX
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc


async def main(path: str, reply: bytes) -> None:
    async def allocate(request: bytes, context: Any) -> bytes:
        return reply

    handler = grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin",
        {"Allocate": grpc.unary_unary_rpc_method_handler(allocate)},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], bytes.fromhex(sys.argv[2])))

"""A bare grpc.aio server answering v1beta1.DevicePlugin unary methods with fixed replies.

The floor for a unary call over a unix socket in Python: no translation, no
validation, no device source. Run by bench/allocate.py in its own process.
Usage: python -m bench.echo_server SOCKET_PATH METHOD=REPLY_HEX ...   (METHOD: Allocate, ...)
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import grpc


def answer(reply: bytes) -> Callable[[bytes, Any], Awaitable[bytes]]:
    async def handle(request: bytes, context: Any) -> bytes:
        return reply

    return handle


async def main(path: str, replies: dict[str, bytes]) -> None:
    handler = grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin",
        {method: grpc.unary_unary_rpc_method_handler(answer(reply)) for method, reply in replies.items()},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    pairs = (arg.partition("=") for arg in sys.argv[2:])
    asyncio.run(main(sys.argv[1], {method: bytes.fromhex(reply) for method, _, reply in pairs}))

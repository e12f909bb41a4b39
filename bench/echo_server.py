"""A bare grpc.aio server answering v1beta1.DevicePlugin unary methods with fixed replies.

The floor for a unary call over a unix socket in Python: no translation, no
validation, no device source. Run by bench/allocate.py in its own process.
With --pipe-hop, each call first sends one line to a child process and waits
for it to come back: a child that copies stdin to stdout with blocking reads, the
least any driver behind a pipe costs (the floor of rows 1 and 3).
Usage: python -m bench.echo_server [--pipe-hop] SOCKET_PATH METHOD=REPLY_HEX ...
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

# One JSON-RPC line, the size of devshim's allocate request for one device.
LINE = (
    b'{"jsonrpc":"2.0","id":1,"method":"allocate",'
    b'"params":{"resource":"example.com/sim-call","containers":[{"device_ids":["dev1"]}]}}\n'
)
COPY = "\n".join(
    [
        "import sys",
        "for line in sys.stdin.buffer:",
        "    sys.stdout.buffer.write(line)",
        "    sys.stdout.buffer.flush()",
    ]
)


def answer(reply: bytes, hop: asyncio.subprocess.Process | None) -> Callable[[bytes, Any], Awaitable[bytes]]:
    async def handle(request: bytes, context: Any) -> bytes:
        if hop is not None:
            assert hop.stdin is not None and hop.stdout is not None
            hop.stdin.write(LINE)
            await hop.stdout.readline()
        return reply

    return handle


async def main(path: str, replies: dict[str, bytes], pipe_hop: bool) -> None:
    hop = None
    if pipe_hop:
        pipe = asyncio.subprocess.PIPE
        hop = await asyncio.create_subprocess_exec(sys.executable, "-c", COPY, stdin=pipe, stdout=pipe)
    handler = grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin",
        {m: grpc.unary_unary_rpc_method_handler(answer(reply, hop)) for m, reply in replies.items()},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    args = sys.argv[1:]
    pipe_hop = args[0] == "--pipe-hop"
    path, *pairs = args[1:] if pipe_hop else args
    replies = {method: bytes.fromhex(reply) for method, _, reply in (p.partition("=") for p in pairs)}
    asyncio.run(main(path, replies, pipe_hop))

"""One JSON-RPC message per line, UTF-8, over any byte stream.

The transport knows nothing of stdio: a subprocess's pipes, the SDK's own
stdin/stdout, or later a unix socket to a driver in another container all
give a StreamReader/StreamWriter pair.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from shim.jsonrpc.errors import ProtocolError

# The agreed maximum size of one message, newline excluded (docs/driver-protocol.md).
# A 50,000-device list with declared grants is about 10 MiB; asyncio's default is 64 KiB.
MAX_LINE_BYTES = 32 * 1024 * 1024


class Transport(Protocol):
    async def read_message(self) -> bytes | None:
        """The next line without its newline; None at end of stream."""
        ...

    async def write_message(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


class StreamTransport:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int = MAX_LINE_BYTES
    ) -> None:
        """``limit``: the reader's own (the StreamReader's ``limit``), named in the error when a
        message exceeds it; devshim reads its drivers with a lower one (driverhost/limits.py)."""
        self._reader = reader
        self._writer = writer
        self._limit = limit

    async def read_message(self) -> bytes | None:
        try:
            line = await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                raise ProtocolError("the stream ended inside a message (no final newline)") from None
            return None
        except asyncio.LimitOverrunError:
            raise ProtocolError(f"a message is longer than the {self._limit}-byte limit") from None
        except ValueError as exc:  # what readuntil raises once the limit is overrun mid-buffer
            raise ProtocolError(f"a message is longer than the {self._limit}-byte limit: {exc}") from None
        return line[:-1]

    async def write_message(self, data: bytes) -> None:
        if len(data) > MAX_LINE_BYTES:
            raise ProtocolError(f"refusing to send a {len(data)}-byte message (limit {MAX_LINE_BYTES})")
        self._writer.write(data + b"\n")
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError, BrokenPipeError):
            await self._writer.wait_closed()

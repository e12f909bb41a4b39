"""A driver as a program: the SDK over this process's stdin and stdout, whatever they are.

devshim hands a driver pipes, but a driver also runs by hand (``python driver.py < requests.jsonl
> answers.jsonl``, docs/sdk.md) or under a supervisor that sends its output to a file. asyncio's
pipe transports take only what can make a reader or writer wait (pipes, sockets, terminals), and
epoll refuses regular files and even /dev/null; those never make anyone wait, so they are read
and written directly. Either way the lines go through the one framing (StreamTransport) and its
limits.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from collections.abc import Callable

from loguru import logger

from shim.jsonrpc import MAX_LINE_BYTES, StreamTransport
from shim.sdk.driver import Driver
from shim.sdk.server import serve

_CHUNK_BYTES = 1 << 16


def run(driver: Driver, *, log_level: str = "INFO") -> None:
    """Serve ``driver`` over stdin/stdout until shutdown; log to stderr, which devshim copies
    line by line under the driver's name (so no timestamps of our own)."""
    logger.remove()
    logger.add(sys.stderr, level=log_level, format="{level}: {message}")
    asyncio.run(_serve_stdio(driver))


def run_configured(
    name: str,
    make: Callable[[], Driver],
    refused: tuple[type[Exception], ...] | None = None,
    *,
    log_level: str = "INFO",
) -> None:
    """``run`` the driver ``make`` builds from its configuration. A configuration it refuses (one
    of ``refused``) is one line on stderr, ``name: why``, and exit status 2, before anything is
    served: devshim shows that line as the driver's failure. By default ``ConfigError``."""
    if refused is None:
        from shim.configfile import ConfigError  # pydantic: only a driver with a config loads it

        refused = (ConfigError,)
    try:
        driver = make()
    except refused as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    run(driver, log_level=log_level)


async def _serve_stdio(driver: Driver) -> None:
    transport = await stdio_transport()
    # stdout is the protocol now: a stray print() in driver code must not corrupt it.
    sys.stdout = sys.stderr
    await serve(driver, transport)


def _can_wait(fd: int) -> bool:
    """A pipe, a socket or a terminal: asyncio's pipe transports serve it."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


async def stdio_transport() -> StreamTransport:
    """This process's stdin and stdout as one transport, each end taken as what it is.

    The writer's protocol is a StreamReaderProtocol, not FlowControlMixin: only the former has
    the close waiter StreamWriter.wait_closed needs (CPython 3.11), so close() returns once the
    last answer (shutdown's) is written."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    incoming = asyncio.StreamReaderProtocol(reader)
    if _can_wait(0):
        await loop.connect_read_pipe(lambda: incoming, sys.stdin.buffer)
    else:
        _FileReader(0, incoming)
    outgoing = asyncio.StreamReaderProtocol(asyncio.StreamReader())
    writer: asyncio.WriteTransport
    if _can_wait(1):
        writer, _ = await loop.connect_write_pipe(lambda: outgoing, sys.stdout.buffer)
    else:
        writer = _FileWriter(1, outgoing)
    return StreamTransport(reader, asyncio.StreamWriter(writer, outgoing, reader, loop))


class _FileReader(asyncio.ReadTransport):
    """A file read a chunk per loop turn, as a pipe delivers it (each request starts as it is
    read), and paused while the reader holds more than its limit, as a pipe is."""

    def __init__(self, fd: int, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self._fd = fd
        self._protocol = protocol
        self._resumed = asyncio.Event()
        self._resumed.set()
        protocol.connection_made(self)
        self._task = asyncio.get_running_loop().create_task(self._pump(), name="stdin")

    async def _pump(self) -> None:
        try:
            while chunk := os.read(self._fd, _CHUNK_BYTES):
                self._protocol.data_received(chunk)
                await asyncio.sleep(0)
                await self._resumed.wait()
        except OSError as exc:
            self._protocol.connection_lost(exc)
            return
        self._protocol.eof_received()
        self._protocol.connection_lost(None)

    def pause_reading(self) -> None:
        self._resumed.clear()

    def resume_reading(self) -> None:
        self._resumed.set()

    def is_reading(self) -> bool:
        return self._resumed.is_set() and not self._task.done()

    def is_closing(self) -> bool:
        return self._task.done()

    def close(self) -> None:
        self._task.cancel()


class _FileWriter(asyncio.WriteTransport):
    """A file written at once: nothing is buffered, so nothing is lost when the process ends."""

    def __init__(self, fd: int, protocol: asyncio.BaseProtocol) -> None:
        super().__init__()
        self._fd = fd
        self._protocol = protocol
        self._closing = False
        protocol.connection_made(self)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        # The descriptor stays open (it is the process's stdout); the protocol hears the end,
        # which lets StreamWriter.wait_closed return.
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().call_soon(self._protocol.connection_lost, None)

"""A driver as a program: the SDK over this process's stdin and stdout."""

from __future__ import annotations

import asyncio
import sys

from loguru import logger

from shim.jsonrpc.framing import stdio_transport
from shim.sdk.driver import Driver
from shim.sdk.server import serve


def run(driver: Driver, *, log_level: str = "INFO") -> None:
    """Serve ``driver`` over stdin/stdout until shutdown; log to stderr, which devshim copies
    line by line under the driver's name (so no timestamps of our own)."""
    logger.remove()
    logger.add(sys.stderr, level=log_level, format="{level}: {message}")
    asyncio.run(_serve_stdio(driver))


async def _serve_stdio(driver: Driver) -> None:
    transport = await stdio_transport()
    # stdout is the protocol now: a stray print() in driver code must not corrupt it.
    sys.stdout = sys.stderr
    await serve(driver, transport)

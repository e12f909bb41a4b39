"""Waiting for a condition, never for a time: what a test on a busy machine must do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Return once `condition()` holds; an AssertionError naming `what` after `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None

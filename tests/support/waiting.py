"""Waiting for a condition, never for a time: what a test on a busy machine must do.

And when a wait is over its bound, saying where everything waited: a hang on a busy CI machine
is found from its report, not by reproducing it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Return once `condition()` holds; an AssertionError naming `what` after `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


class Hung(AssertionError):
    """An await outlived its bound; the message has where every task of the loop was waiting."""


async def bounded(awaitable: Awaitable[T], seconds: float, what: str) -> T:
    """`await awaitable`, or Hung after `seconds`, naming `what` and every task's await chain as
    it was at the deadline (taken just before the cancellation unwinds them)."""
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    snapshot = loop.call_later(max(seconds - 0.01, 0), lambda: seen.append(task_stacks()))
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise Hung(f"{what}: still waiting after {seconds:g} s; the loop's tasks were at:\n"
                   + (seen[0] if seen else task_stacks())) from None  # fmt: skip
    finally:
        snapshot.cancel()


def task_stacks() -> str:
    """Each task of the running loop with its chain of awaits, innermost last."""
    lines = []
    for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
        lines.append(f"- {task.get_name()}")
        lines.extend(f"    {frame}" for frame in _await_chain(task.get_coro()))
    return "\n".join(lines)


def _await_chain(coro: object) -> list[str]:
    frames = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return frames

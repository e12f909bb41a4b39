"""Long work on the event loop, done in slices, one such work at a time.

Reading a driver's list of 50,000 devices or encoding it for the inventory is too long to hold
the loop for (another resource's Allocate waits meanwhile), so it hands the loop back every
SLICE_S. Slices of several such works would stack in one turn of the loop (twelve inventories
saved at once: 24 ms between two steps of an Allocate), so they take turns: one works at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator

SLICE_S = 0.0005  # the longest a slice holds the event loop

_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


class Slices:
    """Ends a slice once SLICE_S has passed since it began: ``await slices.due()`` in the loop."""

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self._slice_s = slice_s
        self._end = time.perf_counter() + slice_s

    async def due(self) -> None:
        if time.perf_counter() > self._end:
            await asyncio.sleep(0)  # other work (another resource's Allocate) runs now
            self._end = time.perf_counter() + self._slice_s


@contextlib.asynccontextmanager
async def sliced(slice_s: float = SLICE_S) -> AsyncIterator[Slices]:
    """One long work's slices, after every other long work begun earlier has ended."""
    turn = _turns.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with turn:
        yield Slices(slice_s)

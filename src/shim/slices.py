"""Long work on the event loop, done in slices, works of a kind in turn.

Reading a driver's list of 50,000 devices or encoding it for the inventory is too long to hold
the loop for (another resource's Allocate waits meanwhile), so it hands the loop back every
SLICE_S. Slices of several such works would stack in one turn of the loop (twelve inventories
saved at once, 2 ms slices each: 24 ms between two steps of an Allocate), so works of a kind take
turns. A short work (a list of a few devices) takes no turn: it never waits for a long one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import AnyStr

SLICE_S = 0.0005  # the longest a slice holds the event loop
JOIN_RUN = 2048  # items joined at once: well under SLICE_S

_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


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
async def sliced(kind: str, slice_s: float = SLICE_S) -> AsyncIterator[Slices]:
    """One long work's slices, after every other long work of its ``kind`` begun earlier has
    ended. Each kind takes its own turns, so a list for the kubelet never waits for inventories
    to be saved: at most one slice of each kind (reading a driver's list, sending one to the
    kubelet, saving one) stacks in a turn of the loop."""
    turns = _turns.setdefault(asyncio.get_running_loop(), {})
    async with turns.setdefault(kind, asyncio.Lock()):
        yield Slices(slice_s)


async def joined(separator: AnyStr, items: Sequence[AnyStr], kind: str) -> AnyStr:
    """``separator.join(items)``, a long one a run of items at a time, in a turn of ``kind``:
    joining 25,000 device records at once holds the loop 2-6 ms here; the runs' few long results
    join in a fraction of that."""
    if len(items) <= JOIN_RUN:
        return separator.join(items)
    runs = []
    async with sliced(kind) as slices:
        for start in range(0, len(items), JOIN_RUN):
            runs.append(separator.join(items[start : start + JOIN_RUN]))
            await slices.due()
    return separator.join(runs)

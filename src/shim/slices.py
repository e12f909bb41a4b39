"""Long work on the event loop, done in slices: one slice a turn of the loop, works of a kind in turn.

Reading a driver's list of 50,000 devices or encoding it for the inventory is too long to hold
the loop for (another resource's Allocate waits meanwhile), so it hands the loop back every
SLICE_S. An Allocate takes about a dozen turns of the loop (gRPC's events, the driver's answer),
and waits in each for whatever slices run in it: slices of several works in one turn (a list
read, encoded for the kubelet and saved at once) added up to 15 ms per Allocate. So every long
work on a loop passes one baton: a slice runs only while holding it, and a work handing it on
gets it back no sooner than the next turn, after the others waiting for it (round robin), after
what else the loop has ready, and after a pause that leaves the CPU to the processes an Allocate
waits for. Works of a kind also take turns as wholes (twelve inventories are saved one after
another, not all held half-done at once). A short work (a list of a few devices) takes no turn:
it never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import AnyStr

SLICE_S = 0.0005  # the longest a slice holds the event loop
# Between two slices the loop runs what else is ready until a turn finds nothing (an empty turn
# takes 6-10 us here; any handle of an Allocate at least 20), for at most YIELD_S (under a steady
# stream of calls long work still gets a fifth of the loop), then rests PAUSE_S (the selector
# waits whole milliseconds): long work takes at most about a third of a core, and the processes
# an Allocate waits for (its driver, the kubelet) get the CPU even on a node with two cores. A
# driver re-sending 25,000 devices costs 10 ms of CPU a list, spread over 30 ms; the first list
# of 50,000 takes 0.8 s instead of 0.3.
EMPTY_TURN_S = 0.00003
YIELD_S = 0.002
PAUSE_S = 0.001
JOIN_RUN = 2048  # items joined at once: well under SLICE_S


class _Baton:
    """Held by the one long work whose slice runs now; handed on in first-come order. A work
    cancelled while waiting leaves the line (and hands the baton on if it was just given it)."""

    def __init__(self) -> None:
        self._held = False
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def take(self) -> None:
        if self._held or self._waiting:
            await self._wait()
        else:
            self._held = True

    async def hand_on(self) -> None:
        """To the work waiting longest; back to this one in a later turn of the loop, after the
        others (``_others_first``)."""
        await self._wait(handing_on=True)
        await _others_first()

    def release(self) -> None:
        self._give()

    def _give(self) -> None:
        """To the first work still waiting (it runs in the next turn of the loop), or to none."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():  # cancelled: skipped
                waiter.set_result(None)
                return
        self._held = False

    async def _wait(self, *, handing_on: bool = False) -> None:
        mine = asyncio.get_running_loop().create_future()
        self._waiting.append(mine)
        if handing_on:
            self._give()
        try:
            if mine.done():  # handed to itself: the others still get a turn of the loop
                await asyncio.sleep(0)
            else:
                await mine
        except asyncio.CancelledError:
            if mine.done() and not mine.cancelled():  # given the baton, gone before using it
                self._give()
            raise


# What a long work makes lives as long as its list: 25,000-50,000 devices read, modelled and
# encoded. Left young, each such list is walked by the garbage collector's next young
# collections, 5-10 ms on the loop per list re-sent at the bound, inside whatever runs then (an
# Allocate). So once a long work ends, what was made goes to the oldest generation at once
# (gc.freeze, then gc.unfreeze: constant time). Garbage with cycles goes along and waits for a
# full collection, which the collector starts less often since the moves skip its count: one
# runs at least every FULL_COLLECTION_S while long works move objects.
FULL_COLLECTION_S = 60.0
_collected_at = time.monotonic()


def _made_old() -> None:
    global _collected_at
    gc.freeze()
    gc.unfreeze()
    if time.monotonic() - _collected_at > FULL_COLLECTION_S:
        gc.collect()  # 50 ms at the device bound: once a minute at most
        _collected_at = time.monotonic()


async def give_way() -> None:
    """For work made of many short steps (DRA prepares by the dozen): let what else the loop has
    ready run first, then rest PAUSE_S, as a long work does between its slices."""
    await _others_first()


async def _others_first() -> None:
    began = time.perf_counter()
    while True:
        turn = time.perf_counter()
        await asyncio.sleep(0)
        now = time.perf_counter()
        if now - turn < EMPTY_TURN_S or now - began > YIELD_S:
            break
    await asyncio.sleep(PAUSE_S)


_batons: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Baton] = weakref.WeakKeyDictionary()
_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


class Slices:
    """Ends a slice once SLICE_S has passed since it began: ``await slices.due()`` in the loop."""

    def __init__(self, baton: _Baton, slice_s: float = SLICE_S) -> None:
        self._baton = baton
        self._slice_s = slice_s
        self._end = time.perf_counter() + slice_s
        self.holding = True  # the baton: False while waiting for it (and once cancelled there)

    async def due(self) -> None:
        if time.perf_counter() > self._end:
            self.holding = False
            await self._baton.hand_on()  # other work (another resource's Allocate) runs now
            self.holding = True
            self._end = time.perf_counter() + self._slice_s


@contextlib.asynccontextmanager
async def sliced(kind: str, slice_s: float = SLICE_S) -> AsyncIterator[Slices]:
    """One long work's slices, after every other long work of its ``kind`` begun earlier has
    ended, each slice holding the loop's baton."""
    loop = asyncio.get_running_loop()
    baton = _batons.setdefault(loop, _Baton())
    async with _turns.setdefault(loop, {}).setdefault(kind, asyncio.Lock()):
        await baton.take()
        slices = Slices(baton, slice_s)
        try:
            yield slices
        finally:
            if slices.holding:
                baton.release()
            _made_old()


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

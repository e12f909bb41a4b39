"""The encodings of a list's items, redone only for the items that changed since the last list.

Device lists change one item at a time (a health change among 10,000 devices), and the sources
keep every unchanged item the same object. Items are matched by identity, never hashed or
compared: hashing 10,000 frozen dataclasses costs more than the rest of a change.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Generic, TypeAlias, TypeVar

from shim import revision
from shim.slices import sliced

T = TypeVar("T")
E = TypeVar("E")
# The items, the last list, its encodings by id, the positions to look up, the result so far.
_Plan: TypeAlias = tuple[tuple[T, ...], tuple[T, ...], dict[int, E], Sequence[int], list[E]]


class EncodedList(Generic[T, E]):
    """One list's encodings, kept for the next list: an item is encoded again unless that very
    object was in the last list. Items must be immutable (an item changed in place keeps its old
    encoding); an equal item in a new object is encoded again. Only the last list is held, which
    keeps its items alive, so an id seen in it cannot belong to another object."""

    FEW = 16  # changed positions below which re-encoding beats indexing the whole last list

    def __init__(self, encode: Callable[[T], E]) -> None:
        self._encode = encode
        self._items: tuple[T, ...] = ()
        self._encoded: list[E] = []

    def encode(self, items: Sequence[T]) -> Sequence[E]:
        """Every item's encoding, in order (read it; it is kept for the next list)."""
        items, previous, known, todo, result = self._plan(items)
        for i in todo:
            result[i] = self._lookup(known, items[i])
        return self._keep(items, result, previous)

    async def encode_in_slices(self, items: Sequence[T], kind: str) -> Sequence[E]:
        """``encode``, handing the event loop back every slice, in turn with other works of
        ``kind`` (shim/slices.py): the first list of 50,000 devices is half a second of Python,
        which on a thread would hold the GIL against the loop in 5 ms turns (the interpreter's
        switch interval) for as long."""
        items, previous, known, todo, result = self._plan(items)
        if len(todo) <= self.FEW:
            for i in todo:
                result[i] = self._lookup(known, items[i])
        else:
            async with sliced(kind) as slices:
                for i in todo:
                    result[i] = self._lookup(known, items[i])
                    await slices.due()
        return self._keep(items, result, previous)

    def _plan(self, items: Sequence[T]) -> _Plan[T, E]:
        """The items, the last list (held by the caller, so the ids in ``known`` stay its items'
        while an encoding in slices waits), the last list's encodings by id, the positions to
        look up, and the result with every other position filled."""
        items = revision.as_tuple(items)
        previous, encoded = self._items, self._encoded
        if len(items) == len(previous):
            # Same length: usually the same items with a few replaced in place, which a revision
            # names (shim/revision.py); else finding them runs in C (map and compress), 3.5 ms
            # for 50,000 items.
            moved = revision.changes(items, previous)
            if moved is None:
                moved = tuple(itertools.compress(range(len(items)), map(operator.is_not, previous, items)))
            known = self._known() if len(moved) > self.FEW else {}
            return items, previous, known, moved, list(encoded)
        # Items added or removed: look each one up among the last list's.
        return items, previous, self._known(), range(len(items)), [None] * len(items)  # type: ignore[list-item]

    def _keep(self, items: tuple[T, ...], result: list[E], previous: tuple[T, ...]) -> list[E]:
        # Holding the items keeps their ids from being reused while the encodings are kept. A list
        # encoded in slices may end after a newer one did: the newer one stays kept.
        if self._items is previous:
            self._items, self._encoded = items, result
        return result

    def _known(self) -> dict[int, E]:
        return {id(item): e for item, e in zip(self._items, self._encoded, strict=True)}

    def _lookup(self, known: dict[int, E], item: T) -> E:
        # An id in ``known`` is an object the last list still holds, so it is this very item.
        e = known.get(id(item))
        return self._encode(item) if e is None else e


class PerObject(Generic[T, E]):
    """``compute(obj)``, kept per object by identity: for immutable objects that sources hand out
    again as the same object (grants.ByDevices, grants.Equal). A lookup by id costs next to
    nothing; one by value would hash the object each time (a grant's hash walks all its fields).

    ``compute`` must depend on nothing but the object, and the object must never change. An
    equal object that is not the same one is computed again: a miss, never a wrong answer. At
    most ``limit`` objects are kept (past that it starts afresh); each entry holds its object, so
    an id is never reused while it is kept. A compute that raises keeps nothing."""

    def __init__(self, compute: Callable[[T], E], limit: int = 1024) -> None:
        self._compute = compute
        self._limit = limit
        self._by_id: dict[int, tuple[T, E]] = {}

    def __call__(self, obj: T) -> E:
        entry = self._by_id.get(id(obj))
        if entry is None or entry[0] is not obj:
            if len(self._by_id) >= self._limit:
                self._by_id.clear()
            entry = self._by_id[id(obj)] = (obj, self._compute(obj))
        return entry[1]

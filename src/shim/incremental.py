"""The encodings of a list's items, redone only for the items that changed since the last list.

Device lists change one item at a time (a health change among 10,000 devices), and the sources
keep every unchanged item the same object. Items are matched by identity, never hashed or
compared: hashing 10,000 frozen dataclasses costs more than the rest of a change.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
E = TypeVar("E")


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
        items = tuple(items)
        previous, encoded = self._items, self._encoded
        if len(items) == len(previous):
            # Same length: usually the same items with a few replaced in place. Finding them runs
            # in C (map and compress), so 10,000 unchanged items cost well under a millisecond.
            moved = list(itertools.compress(range(len(items)), map(operator.is_not, previous, items)))
            result = list(encoded)
            known = self._known() if len(moved) > self.FEW else {}
            for i in moved:
                result[i] = self._lookup(known, items[i])
        else:
            # Items added or removed: look each one up among the last list's.
            known = self._known()
            result = [self._lookup(known, item) for item in items]
        # Holding the items keeps their ids from being reused while the encodings are kept.
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

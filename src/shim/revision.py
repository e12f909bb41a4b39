"""Sequences that say how they differ from the one before them.

A driver at the device bound re-sends 50,000 devices to change one. Every pass over such a list
costs milliseconds even in C here (a dict of 50,000 IDs about 12 ms, comparing two lists by
identity 3.5 ms), and each pass holds the event loop while other resources' Allocates wait. The
reader of the driver's pipe knows which elements it read anew (jsonrpc/sliced.py); it says so
with a revision, and each holder of the list before it (the driver's source, the resource, the
encoders) updates what it derived at those positions alone. A holder of any other list, or of a
plain sequence, derives everything again, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


class RevisedList(list[T]):
    """A list that is ``base`` (by identity) with the items at ``changed`` replaced: the same
    length, and the very same object at every other position. Never changed once made."""

    base: Sequence[Any]
    changed: tuple[int, ...]


class Revised(tuple[T, ...]):
    """RevisedList's immutable form, for lists of the device model."""

    base: Sequence[Any]
    changed: tuple[int, ...]


def revised_list(items: list[T], base: Sequence[Any], changed: Iterable[int]) -> RevisedList[T]:
    revised = RevisedList(items)
    revised.base, revised.changed = base, tuple(changed)
    return revised


def revised(items: Iterable[T], base: Sequence[Any], changed: Iterable[int]) -> Revised[T]:
    revision = Revised(items)
    revision.base, revision.changed = base, tuple(changed)
    return revision


def changes(new: Sequence[Any], old: Sequence[Any]) -> tuple[int, ...] | None:
    """The positions at which ``new`` differs from ``old`` where ``new`` says it is a revision
    of that very ``old``; None where it does not say (compare, or derive everything again)."""
    if isinstance(new, RevisedList | Revised) and new.base is old:
        return new.changed
    return None


def as_tuple(items: Sequence[T]) -> tuple[T, ...]:
    """``items`` as a tuple, a revision kept as it is (``tuple()`` would copy it, and forget)."""
    return items if isinstance(items, tuple) else tuple(items)

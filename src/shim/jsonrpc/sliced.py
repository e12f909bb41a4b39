"""Long messages read in slices, reusing what the last such message already said.

A driver re-sends its whole device list on every change (the protocol's ``devices_changed``,
and every legacy plugin behind the adapter does the same). A list of 50,000 devices is a 5 MB
line: read whole, orjson holds the event loop 20-40 ms and the model built from it a quarter of
a second, while every other resource's Allocate waits. This reader follows one long array of a
message (``devices`` in its params or result) element by element, handing the loop back every
couple of milliseconds, and hands each element to ``convert`` as it reads it (the driver host
builds its model of the device there). Elements written exactly as those at the same places of
the last array that began with the same item (by ``id``) are not read again: found a run at a
time, they are that array's objects, so the caches downstream that match by identity (the
source, the encoders, the inventory) skip them too; an array as long as the last one is handed
over as its revision (shim/revision.py), naming the positions read anew. Objects, arrays
included, are shared between messages: nothing may change a message it was handed.

What it returns, once converted, equals what ``orjson.loads(line)`` gives: every value is read
by orjson (the standard library's scanner only finds where each ends), and a line it does not
follow to the end (not an object, not ASCII, not JSON) goes to orjson whole, so errors read as
they always did. An element ``convert`` refuses stays JSON, for the message's reader to refuse.
"""

from __future__ import annotations

import asyncio
import json
import re
from array import array
from collections import OrderedDict
from collections.abc import Callable
from json.scanner import make_scanner
from typing import Any

import orjson

from shim.revision import revised_list
from shim.slices import Slices, sliced

_RUN = 512  # elements compared as one run at most: well under a slice
_SPACE = re.compile(r"[ \t\n\r]*")
_OUTER = ("params", "result")  # the members holding the long array


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# The C scanner (typeshed types its argument as the scanner itself, not the decoder it reads).
_scan: Callable[[str, int], tuple[Any, int]] = make_scanner(json.JSONDecoder(parse_constant=_refuse))  # type: ignore[arg-type]


class _Unfollowed(Exception):
    """The line is not one this reader follows; orjson reads it whole."""


def _end_of_value(text: str, at: int) -> int:
    try:
        return int(_scan(text, at)[1])
    except StopIteration:  # no value starts here
        raise _Unfollowed from None


def _skip(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # matches the empty string


class _Kept:
    """One array as written (the message's text, where the array begins in it and each element
    starts and ends from there: the text is kept whole, not copied out) and its elements as
    read."""

    __slots__ = ("text", "begin", "starts", "ends", "items")

    def __init__(self, text: str, begin: int, starts: array[int], ends: array[int], items: list[Any]) -> None:
        self.text, self.begin, self.starts, self.ends, self.items = text, begin, starts, ends, items

    def same_run(self, n: int, text: str, at: int) -> int:
        """How many of the elements from the ``n``-th on (at most _RUN) ``text`` holds at ``at``
        exactly as written here, with the separators between them: the whole run compared at
        once (one slice and one comparison in C), and where it differs, halving the difference.
        An element that is a number could go on past its text; then no comma or bracket follows
        it, which the caller finds."""
        left = min(len(self.ends) - n, _RUN)
        if left <= 0 or self._holds(n, left, text, at):
            return max(left, 0)
        good, bad = 0, left
        while bad - good > 1:
            middle = (good + bad) // 2
            good, bad = (middle, bad) if self._holds(n, middle, text, at) else (good, middle)
        return good

    def _holds(self, n: int, count: int, text: str, at: int) -> bool:
        begin = self.begin
        return text.startswith(self.text[begin + self.starts[n] : begin + self.ends[n + count - 1]], at)


class SlicedReader:
    def __init__(
        self,
        convert: Callable[[Any], Any],
        *,
        array: str = "devices",
        key: str = "id",
        min_bytes: int = 64 * 1024,
        keep_chars: int = 16 * 1024 * 1024,
        max_elements: int | None = None,
    ) -> None:
        """``array``: the member of params/result read in slices, each element handed to
        ``convert`` as it is read (an element it raises on is left as JSON, for the reader of the
        message to refuse as it would anyway); ``key``: the member of its first element naming the
        earlier array to compare with; lines under ``min_bytes`` are read whole; at most
        ``keep_chars`` characters of earlier arrays are kept, the oldest dropped; an array longer
        than ``max_elements`` is not converted on: orjson reads the line whole, for its reader to
        refuse the list by its length as before."""
        self._convert, self._array, self._key = convert, array, key
        self._min_bytes, self._keep_chars, self._max_elements = min_bytes, keep_chars, max_elements
        self._kept: OrderedDict[str, _Kept] = OrderedDict()  # by the first element's key

    async def read(self, line: bytes) -> Any:
        if len(line) < self._min_bytes or not line.isascii():
            return orjson.loads(line)
        try:
            async with sliced("driver lists read") as slices:  # after any other list read
                text = line.decode("ascii")
                await slices.due()
                at = _skip(text, 0)
                if text[at] != "{":
                    raise _Unfollowed
                message, at = await self._object(text, at, slices, outer=True)
            if _skip(text, at) != len(text):
                raise _Unfollowed
            await asyncio.sleep(0)  # what takes the message runs in a turn of its own
            return message
        # JSONDecodeError is a ValueError; the standard library's scanner gives up on nesting
        # deeper than about 1,000 (RecursionError), before orjson's 1,024 for the whole line.
        except (_Unfollowed, ValueError, IndexError, RecursionError):
            return orjson.loads(line)  # raises what the short path raises, or reads it after all

    async def _object(self, text: str, at: int, slices: Slices, *, outer: bool) -> tuple[dict[str, Any], int]:
        obj: dict[str, Any] = {}
        at = _skip(text, at + 1)
        if text[at] == "}":
            return obj, at + 1
        while True:
            if text[at] != '"':
                raise _Unfollowed
            end = _end_of_value(text, at)
            key = orjson.loads(text[at:end])
            at = _skip(text, end)
            if text[at] != ":":
                raise _Unfollowed
            at = _skip(text, at + 1)
            if outer and key in _OUTER and text[at] == "{":
                obj[key], at = await self._object(text, at, slices, outer=False)
            elif not outer and key == self._array and text[at] == "[":
                obj[key], at = await self._elements(text, at, slices)
            else:
                end = _end_of_value(text, at)
                obj[key], at = orjson.loads(text[at:end]), end
            at = _skip(text, at)
            if text[at] == "}":
                return obj, at + 1
            if text[at] != ",":
                raise _Unfollowed
            at = _skip(text, at + 1)

    async def _elements(self, text: str, at: int, slices: Slices) -> tuple[list[Any], int]:
        begin = at = _skip(text, at + 1)
        items: list[Any] = []
        starts, ends = array("I"), array("I")  # where each element's text is, from ``begin``
        if text[at] == "]":
            return items, at + 1
        last: _Kept | None = None
        read: list[int] = []  # the positions read anew, not the last array's objects
        while True:
            n = len(items)
            if n == 0:  # which earlier array to compare with: the one its first element began
                last = self._earlier(text[at : _end_of_value(text, at)])
            if last is not None and (same := last.same_run(n, text, at)):
                # Elements n.. are written as before: the last array's objects, and where they are.
                shift = at - begin - last.starts[n]
                items += last.items[n : n + same]
                if shift:
                    starts.extend(map(shift.__add__, last.starts[n : n + same]))
                    ends.extend(map(shift.__add__, last.ends[n : n + same]))
                else:  # where no element before changed its length: copied in C
                    starts += last.starts[n : n + same]
                    ends += last.ends[n : n + same]
                end = begin + ends[-1]
            else:
                end = _end_of_value(text, at)
                read.append(n)
                items.append(self._read(text[at:end]))
                starts.append(at - begin)
                ends.append(end - begin)
            if self._max_elements is not None and len(items) > self._max_elements:
                raise _Unfollowed
            at = _skip(text, end)
            if text[at] == "]":
                break
            if text[at] != ",":
                raise _Unfollowed
            at = _skip(text, at + 1)
            await slices.due()
        if last is not None and len(items) == len(last.items):
            # The last array's objects at every other position: those who hold it redo these alone.
            items = revised_list(items, last.items, read)
        self._keep(text, begin, starts, ends, items)
        return items, at + 1

    def _read(self, written: str) -> Any:
        element = orjson.loads(written)
        try:
            return self._convert(element)
        except Exception:  # left as JSON: whoever reads the message refuses it, with the reason
            return element

    def _name(self, written: str) -> str | None:
        first = orjson.loads(written)
        name = first.get(self._key) if isinstance(first, dict) else None
        return name if isinstance(name, str) else None

    def _earlier(self, first: str) -> _Kept | None:
        name = self._name(first)
        return None if name is None else self._kept.get(name)

    def _keep(self, text: str, begin: int, starts: array[int], ends: array[int], items: list[Any]) -> None:
        name = self._name(text[begin : begin + ends[0]])
        if name is None:
            return
        self._kept.pop(name, None)
        self._kept[name] = _Kept(text, begin, starts, ends, items)
        total = sum(len(kept.text) for kept in self._kept.values())
        while total > self._keep_chars and len(self._kept) > 1:
            total -= len(self._kept.popitem(last=False)[1].text)

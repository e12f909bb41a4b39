"""A driver's stderr, and its `log` notifications, as log lines bounded in length and in rate
(no I/O here).

devshim reads a driver's stderr as fast as the driver writes it, whatever it writes: a pipe
nobody drains blocks the driver at its next write. What reaches the log is bounded instead.
A line longer than ``max_line_bytes`` is logged cut, with a marker, and the rest of it is
skipped as it arrives, so memory stays bounded even for a line with no end. Beyond
``max_lines_per_s`` lines in a one-second window, lines are counted and dropped, and one
warning says how many once the window is over. Characters a log viewer acts on rather than
shows are shown escaped (``escaped``), so a driver cannot forge, split, reverse or garble log
lines with them. A `log` notification (DriverLog) is one line under the same rules, with its own
budget.
"""

from __future__ import annotations

import functools
import math
import sys
import unicodedata
from collections.abc import Callable

# (level, message): called for each line to log and for each summary of dropped lines.
Emit = Callable[[str, str], None]

# What a terminal or log viewer acts on instead of showing: controls (Cc: C0, DEL and C1, whose
# NEL ends a line), format characters (Cf: the bidi embeddings, overrides, isolates and marks
# that reverse what follows them, zero-width ones) and the line and paragraph separators (Zl, Zp:
# new lines to a viewer). Tab stays: drivers' stack traces indent with it.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _escape(code: int) -> str:
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


@functools.cache
def _escapes() -> dict[int, str]:
    """The str.translate table of every such character, built once, on the first line that has
    any (a category per code point: a fifth of a second, not worth paying at every start)."""
    category = unicodedata.category
    return {
        code: _escape(code)
        for code in range(sys.maxunicode + 1)
        if code != 0x09 and category(chr(code)) in _ESCAPED_CATEGORIES
    }


def escaped(text: str) -> str:
    """``text`` with every character of Unicode categories Cc, Cf, Zl and Zp but tab shown as
    ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``: one line, shown as written, left to right."""
    if text.isprintable():  # none of them (nor tab) in it, found at C speed: the common line
        return text
    return text.translate(_escapes())


class _Budget:
    """At most `max_lines_per_s` lines in a one-second window; the rest are counted, and one
    warning says how many when the window ends (`end_window`, called by a timer)."""

    def __init__(self, max_lines_per_s: int, emit: Emit, what: str) -> None:
        self._max_lines = max_lines_per_s
        self._emit = emit
        self._what = what
        self.window_end = -math.inf
        self._logged = 0
        self.dropped = 0  # lines dropped in the current window
        self._summary_at = -math.inf

    def summary_due(self) -> float | None:
        """When the current window has dropped lines: its end, once, for a timer to call
        end_window then (so the warning comes even if the driver falls silent)."""
        if self.dropped and self._summary_at != self.window_end:
            self._summary_at = self.window_end
            return self.window_end
        return None

    def _spent(self, now: float) -> bool:
        return now < self.window_end and self._logged >= self._max_lines

    def _admit(self, now: float) -> bool:
        """Whether one more line may be logged at `now` (if not, it is counted as dropped)."""
        if now >= self.window_end:
            self.end_window(self.window_end)
            self.window_end = now + 1.0
        if self._logged < self._max_lines:
            self._logged += 1
            return True
        self.dropped += 1
        return False

    def end_window(self, end: float) -> None:
        """The window that ends at ``end`` is over (a timer calls this): say what it dropped.

        A call for a window that is no longer the current one does nothing."""
        if end != self.window_end:
            return
        if self.dropped:
            limit = f"more than {self._max_lines} lines/s"
            self._emit("WARNING", f"{self.dropped} {self._what} dropped ({limit})")
        self.dropped = self._logged = 0
        self.window_end = -math.inf


def _shown(raw: bytes, max_bytes: int, cut: bool) -> str:
    text = escaped(raw.decode(errors="replace").rstrip())
    return f"{text} [line cut at {max_bytes} bytes]" if cut else text


class DriverLog(_Budget):
    """A driver's `log` notifications: each one line, escaped, cut at `max_line_bytes`."""

    def __init__(self, max_line_bytes: int, max_lines_per_s: int, emit: Emit) -> None:
        super().__init__(max_lines_per_s, emit, "log messages")
        self._max_bytes = max_line_bytes

    def log(self, level: str, message: str, now: float) -> None:
        if self._admit(now):
            raw = message.encode(errors="replace")
            cut = len(raw) > self._max_bytes
            self._emit(level, _shown(raw[: self._max_bytes], self._max_bytes, cut))


class StderrLines(_Budget):
    def __init__(self, max_line_bytes: int, max_lines_per_s: int, emit: Emit) -> None:
        super().__init__(max_lines_per_s, emit, "stderr lines")
        self._max_bytes = max_line_bytes
        self._line = bytearray()  # the start of the current line, at most max_line_bytes
        self._skipping = False  # the current line is already decided (logged cut, or dropped)

    def feed(self, data: bytes, now: float) -> None:
        """Take the next bytes the driver wrote, read at ``now`` (seconds, monotonic)."""
        start = 0
        while start < len(data):
            if self._spent(now):
                self._drop_all(data[start:])
                return
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            if not self._skipping:
                room = self._max_bytes - len(self._line)
                self._line += data[start : start + min(room, end - start)]
                if end - start > room:
                    self._decide(now, cut=True)
            if newline < 0:
                return
            if not self._skipping:
                self._decide(now, cut=False)
            self._skipping = False
            start = newline + 1

    def _drop_all(self, data: bytes) -> None:
        """The window's budget is spent: decide every line in ``data`` at C speed, dropping it."""
        newlines = data.count(b"\n")
        tail = data
        if newlines:
            # The first newline only ends a line that was decided already, if one was.
            self.dropped += newlines - (1 if self._skipping else 0)
            self._line.clear()
            self._skipping = False
            tail = data[data.rfind(b"\n") + 1 :]
        if not self._skipping:
            room = self._max_bytes - len(self._line)
            self._line += tail[:room]
            if len(tail) > room:
                self.dropped += 1
                self._line.clear()
                self._skipping = True

    def _decide(self, now: float, *, cut: bool) -> None:
        """Log or drop the current line (complete, or cut at the length limit)."""
        if self._admit(now):
            self._emit("INFO", _shown(bytes(self._line), self._max_bytes, cut))
        self._line.clear()
        self._skipping = cut

    def close(self, now: float) -> None:
        """The stream ended: log an unfinished last line, then what the window dropped."""
        if self._line and not self._skipping:
            self._decide(now, cut=False)
        self.end_window(self.window_end)

"""A driver's stderr reaches the log bounded: lines cut at a length, a rate limit with a count of
what it dropped, control characters escaped; and memory stays bounded whatever the driver writes."""

from __future__ import annotations

import tracemalloc

from shim.driverhost.stderr import StderrLines


class Log:
    def __init__(self, max_line_bytes: int = 100, max_lines_per_s: int = 1000) -> None:
        self.entries: list[tuple[str, str]] = []
        self.lines = StderrLines(max_line_bytes, max_lines_per_s, lambda *entry: self.entries.append(entry))

    def texts(self, level: str = "INFO") -> list[str]:
        return [text for lvl, text in self.entries if lvl == level]


def test_lines_split_across_reads_are_logged_whole() -> None:
    """A line is logged once its newline arrives, however the pipe cut it into reads."""
    log = Log()
    for piece in (b"fir", b"st\nsec", b"ond\n", b"third"):
        log.lines.feed(piece, 0.0)
    assert log.texts() == ["first", "second"]
    log.lines.close(0.0)
    assert log.texts() == ["first", "second", "third"]


def test_a_long_line_is_cut_with_a_marker_and_its_rest_skipped() -> None:
    """The head of an over-long line is logged at once with a marker; the rest of that line is
    skipped, and the next line is logged normally."""
    log = Log(max_line_bytes=100)
    log.lines.feed(b"a" * 60, 0.0)
    log.lines.feed(b"b" * 60, 0.0)
    log.lines.feed(b"c" * 500 + b"\nnext\n", 0.0)
    assert log.texts() == ["a" * 60 + "b" * 40 + " [line cut at 100 bytes]", "next"]


def test_a_line_of_exactly_the_limit_is_not_cut() -> None:
    log = Log(max_line_bytes=100)
    log.lines.feed(b"x" * 100, 0.0)
    log.lines.feed(b"\n", 0.0)
    assert log.texts() == ["x" * 100]


def test_control_characters_are_escaped_so_a_driver_cannot_forge_log_output() -> None:
    """Carriage returns and terminal escapes are shown, not obeyed; tabs stay."""
    log = Log()
    log.lines.feed(b"ok\r\x1b[2Kfake line\tend\n", 0.0)
    assert log.texts() == ["ok\\x0d\\x1b[2Kfake line\tend"]


def test_beyond_the_rate_lines_are_dropped_and_counted_once_the_window_ends() -> None:
    """At most max_lines_per_s lines in a one-second window; the rest are counted and reported
    in one warning when the window ends, and every line is either logged or counted."""
    log = Log(max_lines_per_s=10)
    log.lines.feed(b"".join(b"line %d\n" % n for n in range(25)), 5.0)
    assert log.texts() == [f"line {n}" for n in range(10)]
    assert log.lines.dropped == 15 and log.texts("WARNING") == []
    log.lines.end_window(log.lines.window_end)  # the timer, at 6.0
    assert log.texts("WARNING") == ["15 stderr lines dropped (more than 10 lines/s)"]
    log.lines.feed(b"later\n", 6.5)
    assert log.texts()[-1] == "later"


def test_a_line_after_the_window_reports_the_drops_first_if_the_timer_was_late() -> None:
    log = Log(max_lines_per_s=1)
    log.lines.feed(b"one\ntwo\nthree\n", 0.0)
    log.lines.feed(b"four\n", 1.5)
    assert log.entries == [
        ("INFO", "one"),
        ("WARNING", "2 stderr lines dropped (more than 1 lines/s)"),
        ("INFO", "four"),
    ]
    log.lines.end_window(1.0)  # the late timer of the first window: nothing more to say
    assert len(log.entries) == 3


def test_dropping_in_bulk_counts_exactly_with_partial_and_cut_lines() -> None:
    """Once the budget is spent whole reads are dropped by counting newlines; a line begun before
    and one cut at the length limit are each still one line."""
    log = Log(max_line_bytes=100, max_lines_per_s=1)
    log.lines.feed(b"kept\npart", 0.0)  # "part" begins a line; the budget is spent
    log.lines.feed(b"ial\n" + b"y" * 300, 0.1)  # partial ends (1 dropped); a long line begins
    log.lines.feed(b"y" * 300 + b"\nz\nw", 0.2)  # the long one ends (1, already counted), z (1)
    log.lines.close(0.3)  # w (1)
    assert log.texts() == ["kept"]
    assert log.texts("WARNING") == ["4 stderr lines dropped (more than 1 lines/s)"]


def test_an_endless_line_keeps_memory_bounded() -> None:
    """64 MiB with no newline: the copy holds at most the cut head, never the line."""
    log = Log(max_line_bytes=4096)
    chunk = b"z" * (256 * 1024)
    tracemalloc.start()
    try:
        for _ in range(256):
            log.lines.feed(chunk, 0.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, peak
    assert len(log.texts()) == 1 and log.texts()[0].endswith("[line cut at 4096 bytes]")

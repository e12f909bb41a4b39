"""shim.compat.tails.log_tail: the end of a log a process under test wrote, however large."""

from __future__ import annotations

from pathlib import Path

from shim.compat.tails import log_tail


def test_the_last_characters_of_a_log_multibyte_ones_too(tmp_path: Path) -> None:
    log = tmp_path / "plugin.log"
    log.write_text("x" * 10_000 + "end: é€😀\n", encoding="utf-8")
    assert log_tail(log, 8) == "end: é€😀\n"[-8:]
    assert log_tail(log, 100_000) == log.read_text(encoding="utf-8")


def test_a_64_gib_log_is_read_from_its_end_only(tmp_path: Path) -> None:
    """Hostile input: a plugin that wrote 64 GiB (sparse here) costs the judge a few kB, not the
    file (reading it whole would need 64 GiB of memory, more than the machine has)."""
    log = tmp_path / "huge.log"
    with log.open("wb") as out:
        out.truncate(64 << 30)
        out.seek(0, 2)
        out.write(b"\xff\xfe broken bytes, then the last words\n")
    got = log_tail(log, 20)
    assert got == "then the last words\n"[-20:]


def test_a_missing_or_unreadable_log_is_empty(tmp_path: Path) -> None:
    assert log_tail(tmp_path / "never-written.log", 100) == ""
    assert log_tail(tmp_path, 100) == ""  # a directory

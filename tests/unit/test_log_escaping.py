"""How a driver's stderr lines and `log` messages are shown: every character of Unicode categories
Cc, Cf, Zl and Zp (tab aside) escaped, so that a line stays one line, reads left to right, and
cannot pass for one of devshim's (docs/reliability.md, "Attacks")."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from shim.driverhost.stderr import DriverLog, StderrLines, escaped

HIDDEN = {"Cc", "Cf", "Zl", "Zp"}


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\u0085b", "a\\x85b"),  # NEL: a new line to many viewers
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),
        ("\u202egnp.exe", "\\u202egnp.exe"),  # RIGHT-TO-LEFT OVERRIDE: shown as "exe.png"
        ("\u202a\u202b\u202c\u202d", "\\u202a\\u202b\\u202c\\u202d"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),
        ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("tag\U000e0041", "tag\\U000e0041"),
        ("a\x1b[31mb\x7f\x00", "a\\x1b[31mb\\x7f\\x00"),  # C0 and DEL, as before
        ("a\tb", "a\tb"),  # tab stays: stack traces indent with it
        ("80Gi é ٣ 中文 \u00a0nbsp", "80Gi é ٣ 中文 \u00a0nbsp"),  # shown as written
    ],
)
def test_characters_a_log_viewer_acts_on_are_escaped_and_others_kept(text: str, shown: str) -> None:
    assert escaped(text) == shown


def test_every_character_of_those_categories_is_escaped_and_none_other() -> None:
    """All of Unicode, one character at a time: the output holds none of them, and a character
    outside them is left as it is."""
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue  # surrogates never reach it: the lines are decoded with errors="replace"
        hidden = unicodedata.category(char) in HIDDEN and char != "\t"
        out = escaped(char)
        assert (out != char) == hidden, hex(code)
        assert all(unicodedata.category(c) not in HIDDEN or c == "\t" for c in out), hex(code)


def test_a_stderr_line_and_a_log_message_are_shown_escaped() -> None:
    """Through the two readers devshim logs a driver's lines with."""
    emitted: list[tuple[str, str]] = []
    forged = "x\u20282026-12-01 00:00:00.000 | ERROR | forged\u0085y\u202ez"
    lines = StderrLines(4096, 100, lambda level, text: emitted.append((level, text)))
    lines.feed(forged.encode() + b"\n", now=0.0)
    DriverLog(4096, 100, lambda level, text: emitted.append((level, text))).log("ERROR", forged, now=0.0)
    shown = "x\\u20282026-12-01 00:00:00.000 | ERROR | forged\\x85y\\u202ez"
    assert emitted == [("INFO", shown), ("ERROR", shown)]

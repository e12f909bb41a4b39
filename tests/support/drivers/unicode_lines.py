"""A driver that tries to forge, split and reverse devshim's log lines with Unicode, for the
log-escaping tests (tests/compat/test_driver_log_escaping.py). Standard library only.

Serves ``example.com/lines`` with one device, ``line-0``. Before answering ``list_devices`` it
writes ``FORGERY`` (with ``stderr`` in it) to its stderr, as one line, and sends it (with
``log`` in it) as one ``log`` notification at ERROR; ``allocate`` fails with it (with
``error`` in it, and a newline before the first forged line) as its error message.
``FORGERY`` holds NEL (U+0085), LINE SEPARATOR (U+2028) and PARAGRAPH SEPARATOR (U+2029),
each followed by a devshim-like log line, then every bidi control (U+202A-U+202E,
U+2066-U+2069, U+200E, U+200F, U+061C) and a tag character (U+E0041), each in front of the word
it would reverse or hide.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

RESOURCE = "example.com/lines"
FORGED = "2026-12-01 00:00:00.000 | ERROR    | shim.core:gone:1 - example.com/other: gone"
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
FORGERY = (
    "{where} says\u0085" + FORGED + "\u2028" + FORGED + "\u2029" + FORGED + " "
    + " ".join(f"{c}word" for c in BIDI)
    + " \U000e0041tag"
)  # fmt: skip


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def answer(method: str) -> dict[str, Any] | None:
    """The result of ``method``; None for a method this driver does not have."""
    if method == "initialize":
        return {
            "protocol_version": "1.0.0",
            "driver": {"name": "unicode-lines", "version": "0.0.0"},
            "resources": [{"name": RESOURCE}],
        }
    if method == "list_devices":
        os.write(2, (FORGERY.format(where="stderr") + "\n").encode())
        send({"method": "log", "params": {"level": "ERROR", "message": FORGERY.format(where="log")}})
        return {"devices": [{"id": "line-0", "health": "HEALTHY"}]}
    if method == "shutdown":
        return {}
    return None


def main() -> None:
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if "id" not in request:
            continue
        if request["method"] == "allocate":
            message = FORGERY.format(where="error").replace("says\u0085", "says\n", 1)
            send({"id": request["id"], "error": {"code": -32000, "message": message}})
            continue
        result = answer(request["method"])
        if result is None:
            send({"id": request["id"], "error": {"code": -32601, "message": "method not found"}})
        else:
            send({"id": request["id"], "result": result})
        if request["method"] == "shutdown":
            return


if __name__ == "__main__":
    main()

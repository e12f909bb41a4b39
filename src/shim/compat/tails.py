"""The end of a log file, read from its end: a process under test may write gigabytes, and a
failure message needs only its last lines."""

from __future__ import annotations

import os
from pathlib import Path

_MAX_BYTES_PER_CHAR = 4  # UTF-8


def log_tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of ``path`` (undecodable bytes replaced), reading at most
    4 bytes a character from its end; "" when it cannot be read."""
    try:
        with path.open("rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - chars * _MAX_BYTES_PER_CHAR))
            data = log.read(chars * _MAX_BYTES_PER_CHAR)
    except OSError:
        return ""
    return data.decode(errors="replace")[-chars:]

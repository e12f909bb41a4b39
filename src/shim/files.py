"""Files devshim keeps and reads: written whole or not at all, read within a bound.

Every file devshim writes (the inventory, DRA checkpoints, CDI specs) goes through
``write_atomically``, and every file it reads that someone else could have put there (settings,
drivers' configurations, its own state after a restart) through ``read_bounded``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path


class UnreadableFile(OSError):
    """A file that was not read: missing, not a regular file, a link where none may be, too big.
    `strerror` says why, without the path."""


def read_bounded(path: Path, limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them, or UnreadableFile.

    Opened without blocking, so a FIFO put in its place is refused instead of hanging the reader;
    a device (/dev/zero) is refused before a byte is read; with `follow_links` false a symbolic
    link at `path` itself is refused (files devshim writes are never links).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise UnreadableFile(exc.errno, "it is a symbolic link") from None
        raise UnreadableFile(exc.errno, exc.strerror) from None
    # Checked on the bare descriptor: fdopen itself raises IsADirectoryError for a directory.
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnreadableFile(errno.EINVAL, "it is not a regular file")
    with os.fdopen(fd, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFile(errno.EFBIG, f"it is larger than {limit} bytes")
    return data


def write_atomically(path: Path, data: bytes, *, mode: int, synced: bool = True) -> None:
    """``data`` at ``path`` whole or not at all (a rename in the same directory), synced unless
    told: unsynced, the file is whole for every process of this boot (the page cache holds it),
    but a power cut may leave the older file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            if synced:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not synced:
        return
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself lives in the directory
    finally:
        os.close(folder)

"""Unix sockets in tests: directories with short paths, and sockets bound in them."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def short_temp_dir(prefix: str = "ds-") -> Iterator[Path]:
    """A fresh directory under /tmp, removed with everything in it on the way out.

    Unix socket paths must fit in sun_path (108 bytes with the NUL), and pytest's tmp_path is
    often longer than that once a socket name is appended.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def bound_socket(path: Path, listen: bool) -> socket.socket:
    """A unix stream socket bound at ``path`` (listening if ``listen``), as another program's."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    if listen:
        sock.listen()
    return sock

"""Unix socket hygiene for plugin endpoints."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

from shim.errors import ShimError

# A file's identity: a socket re-created at the same path gets a new one
# (the inode number alone may be reused, its change time is not).
FileIdentity = tuple[int, int, int]


class SocketInUse(ShimError):
    """Our socket path is taken by something we must not remove."""


def identity(path: Path) -> FileIdentity | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def answers(path: Path) -> bool:
    """Something accepts connections on the socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def clear_stale_socket(path: Path) -> None:
    """Remove a leftover socket at our own path; refuse anything else.

    Only this resource's own socket name is ever passed here, so another
    plugin's socket is never touched; a regular file or a socket somebody is
    still serving on is an error rather than something to delete.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
    if answers(path):
        raise SocketInUse(f"another process is serving on {path}; is a second devshim running?")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def restrict_socket(path: Path) -> None:
    """Owner-only access: the kubelet runs as root, nobody else needs our socket."""
    os.chmod(path, 0o600)


def remove_own_socket(path: Path, created: FileIdentity | None) -> None:
    """Remove our socket only if it is still the one we created."""
    if created is not None and identity(path) == created:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

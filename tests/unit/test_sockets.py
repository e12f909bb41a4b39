"""Socket hygiene: remove only our own stale socket, never another plugin's or a live one."""

from __future__ import annotations

from pathlib import Path

import pytest

from shim.node.sockets import SocketInUse, clear_stale_socket, identity, remove_own_socket
from tests.support.unix import bound_socket


def test_a_stale_socket_of_our_name_is_removed(short_dir: Path) -> None:
    """A socket left by a previous run (nobody listening) is cleared so we can bind."""
    path = short_dir / "ours.sock"
    bound_socket(path, listen=False).close()
    clear_stale_socket(path)
    assert not path.exists()


def test_a_live_socket_is_never_removed(short_dir: Path) -> None:
    """If something still answers on our path, devshim refuses to start instead of stealing it."""
    path = short_dir / "ours.sock"
    with bound_socket(path, listen=True), pytest.raises(SocketInUse, match="another process is serving"):
        clear_stale_socket(path)
    assert path.exists()


def test_a_regular_file_at_our_path_is_refused(short_dir: Path) -> None:
    """A non-socket file is somebody's data: refuse, do not delete."""
    path = short_dir / "ours.sock"
    path.write_text("data")
    with pytest.raises(SocketInUse, match="not a socket"):
        clear_stale_socket(path)
    assert path.read_text() == "data"


def test_shutdown_removes_only_the_socket_we_created(short_dir: Path) -> None:
    """If our path was replaced by someone else's socket, shutdown leaves theirs alone."""
    path = short_dir / "ours.sock"
    bound_socket(path, listen=False).close()
    ours = identity(path)
    path.unlink()
    theirs = bound_socket(path, listen=False)
    remove_own_socket(path, ours)
    assert path.exists()
    theirs.close()
    remove_own_socket(path, identity(path))
    assert not path.exists()

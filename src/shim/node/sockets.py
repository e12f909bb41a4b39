"""Unix socket hygiene for plugin endpoints.

A plugin socket is never reachable with looser permissions than configured, not even briefly:
gRPC binds it inside a fresh 0700 directory beside its final path, devshim sets its mode and
group there, then renames it into place (``PrivateBind``). rename(2) is atomic, so the kubelet
and its plugin watcher only ever see the finished, listening socket. (A umask around the bind
would do for the mode alone, but the umask is process-wide, and other threads create files
meanwhile (inventory saves run on asyncio's thread pool and may create directories, which a
umask of 0177 would leave untraversable); nor can a umask set a group.)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import stat
import time
from pathlib import Path
from types import TracebackType

from shim.errors import ShimError
from shim.settings import SocketSettings, group_id

# Dot names: the kubelet's plugin watcher ignores every file and directory whose name starts
# with "." (pluginwatcher/plugin_watcher.go, handleCreateEvent), and its start-up walk, which
# does enter such a directory, then ignores the ".s" socket in it. In device-plugins/ the
# kubelet's cleanup keeps directories, and it only ever dials the sockets plugins register.
BIND_DIR_PREFIX = ".devshim-bind-"
BIND_NAME = ".s"
# A bind takes milliseconds: a private directory this old was left by a devshim that died.
STALE_BIND_DIR_S = 60.0

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


class SocketSetupFailed(ShimError):
    """Our socket could not be given its configured permissions."""


class PrivateBind:
    """A socket bound where nobody else can reach it, then published whole at ``final``::

        with PrivateBind(final, settings.socket) as bind:
            server.add_insecure_port(f"unix:{bind.path}")
            await server.start()
            created = bind.publish()

    The private directory is removed on leaving the block, whatever happened in it.
    """

    def __init__(self, final: Path, permissions: SocketSettings) -> None:
        self.final = final
        self.permissions = permissions
        self.directory = final.parent / f"{BIND_DIR_PREFIX}{secrets.token_hex(4)}"
        self.path = self.directory / BIND_NAME

    def __enter__(self) -> PrivateBind:
        remove_stale_bind_dirs(self.final.parent)
        os.mkdir(self.directory, 0o700)
        os.chmod(self.directory, 0o700)  # mkdir's mode is filtered by the umask: make it exact
        return self

    def publish(self) -> FileIdentity:
        """Give the bound socket its mode and group, move it to its final name; its identity there."""
        group = self.permissions.group
        try:
            if group is not None:
                os.chown(self.path, -1, group_id(group))
            os.chmod(self.path, self.permissions.mode)
        except PermissionError as exc:
            raise SocketSetupFailed(
                f"cannot give {self.final.name} group {group}: {exc.strerror} "
                "(a group devshim is not a member of needs CAP_CHOWN)"
            ) from None
        os.rename(self.path, self.final)
        created = identity(self.final)
        if created is None:
            raise FileNotFoundError(self.final)
        return created

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def remove_stale_bind_dirs(directory: Path) -> None:
    """Remove private bind directories that a devshim which died mid-bind left behind.

    Only old ones: a younger one may belong to another devshim binding right now (a rolling
    update runs two on a node)."""
    now = time.time()
    for entry in directory.glob(f"{BIND_DIR_PREFIX}*"):
        with contextlib.suppress(FileNotFoundError):
            st = entry.lstat()
            if stat.S_ISDIR(st.st_mode) and now - st.st_mtime > STALE_BIND_DIR_S:
                shutil.rmtree(entry, ignore_errors=True)


def remove_own_socket(path: Path, created: FileIdentity | None) -> None:
    """Remove our socket only if it is still the one we created."""
    if created is not None and identity(path) == created:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

"""Unix sockets in a directory that someone else may write to: the legacy plugin's --kubelet-dir.

In the sidecar form that directory is an emptyDir shared with the vendor's container, which must
be able to create its own socket there, while the adapter runs as root. So nothing here acts on a
path in it that the other side could redirect: the directory is held open and every name is
looked up relative to it, without following symlinks.

- Our kubelet.sock is bound in a fresh 0700 directory of our own inside it, reached through
  /proc/self/fd so that renaming that directory does not redirect the bind; it gets its mode
  there and is then renamed into place: it never exists at kubelet.sock with another mode, and
  no chmod ever resolves a name the other side controls. (Not a umask around the bind: gRPC binds
  from its own threads; and fchmod does not apply to a socket's file.)
- A plugin's endpoint must be a plain name there, of a socket with a single link; it is pinned
  with an O_PATH descriptor, checked with fstat, and dialled through /proc/self/fd: the socket
  dialled is the one checked, whatever happens to the name after.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from shim.facts import KUBELET_SOCKET

BIND_DIR_PREFIX = ".devshim-legacy-bind-"
BIND_NAME = ".s"
NAME_MAX = 255  # bytes in one file name (Linux NAME_MAX)

# The identity of a file: device and inode. (The change time of a socket moves when it is
# renamed into place, so it is left out.)
Identity = tuple[int, int]


class EndpointRefused(Exception):
    """A plugin named an endpoint that the adapter will not dial; the text says why."""


def endpoint_problem(name: str) -> str | None:
    """Why ``name`` cannot be a plugin's endpoint in the directory; None if it is a plain name."""
    if name in ("", ".", ".."):
        return f"endpoint {name!r} is not a file name"
    if "/" in name or "\0" in name:
        return f"endpoint {name!r} is not a plain file name in the device plugin directory"
    if len(name.encode()) > NAME_MAX:
        return f"endpoint of {len(name.encode())} bytes is longer than a file name may be ({NAME_MAX})"
    if name == KUBELET_SOCKET:
        return f"endpoint {name!r} is the kubelet's own socket"
    return None


def _socket_problem(name: str, st: os.stat_result) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return f"endpoint {name!r} is a symlink, not a socket"
    if not stat.S_ISSOCK(st.st_mode):
        return f"endpoint {name!r} is not a socket"
    if st.st_nlink != 1:
        # A socket a plugin binds has one link; another is a hard link to someone else's socket.
        return f"endpoint {name!r} is a socket with {st.st_nlink} links, not one the plugin bound"
    return None


class PinnedSocket:
    """A plugin's socket, held by an O_PATH descriptor: dialling ``dial_path`` reaches this very
    socket file, whatever its name in the directory is made to point to later. Close it only
    once nothing dials it any more (the descriptor's number may then be reused)."""

    def __init__(self, fd: int, identity: Identity) -> None:
        self.fd = fd
        self.identity = identity

    @property
    def dial_path(self) -> Path:
        return Path(f"/proc/self/fd/{self.fd}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SharedDir:
    """The kubelet directory, held open; every lookup in it is relative to it and never follows
    a symlink in it. (The directory's own path is the operator's and trusted; only its entries
    may be the other side's.)"""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def identity(self, name: str) -> Identity | None:
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino)

    def check_endpoint(self, name: str) -> None:
        """Raise EndpointRefused unless ``name`` is a plain name that is absent (a plugin may
        register before it serves) or a socket of one link."""
        problem = endpoint_problem(name)
        if problem is None:
            try:
                problem = _socket_problem(name, os.stat(name, dir_fd=self.fd, follow_symlinks=False))
            except FileNotFoundError:
                return
        if problem is not None:
            raise EndpointRefused(problem)

    def pin(self, name: str) -> PinnedSocket | None:
        """The socket now at ``name``, pinned; None while there is nothing there.

        Raises EndpointRefused for anything but a socket of one link (a symlink is opened as
        itself, never followed)."""
        problem = endpoint_problem(name)
        if problem is not None:
            raise EndpointRefused(problem)
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        st = os.fstat(fd)
        problem = _socket_problem(name, st)
        if problem is not None:
            os.close(fd)
            raise EndpointRefused(problem)
        return PinnedSocket(fd, (st.st_dev, st.st_ino))

    def remove_if(self, name: str, identity: Identity | None) -> None:
        """Remove ``name`` only if it is still the file of that identity (unlink never follows)."""
        if identity is not None and self.identity(name) == identity:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.fd)


class PrivateBind:
    """A socket bound where only we can reach it, then published at ``name`` in the shared dir::

        bind = PrivateBind(shared, KUBELET_SOCKET)
        server.add_insecure_port(f"unix:{bind.path}")
        await server.start()
        created = bind.publish(0o666)
        ...
        await server.stop(None)
        bind.close()

    Close it only after the server has stopped: gRPC removes its socket by the bound path on
    shutdown, and that path names our directory through our descriptor to it.
    """

    def __init__(self, shared: SharedDir, name: str) -> None:
        self.shared = shared
        self.name = name
        while True:
            self.dirname = f"{BIND_DIR_PREFIX}{secrets.token_hex(8)}"
            try:
                # mkdir never follows a symlink planted under this name; it fails instead.
                os.mkdir(self.dirname, 0o700, dir_fd=shared.fd)
                break
            except FileExistsError:
                continue
        self.fd = os.open(
            self.dirname, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=shared.fd
        )
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid():  # swapped for another's between mkdir and open
            os.close(self.fd)
            raise PermissionError(f"{shared.path / self.dirname} is not the directory we created")
        os.fchmod(self.fd, 0o700)  # mkdir's mode went through the umask: make it exact
        if not os.path.isdir(self.path.parent):
            os.close(self.fd)
            os.rmdir(self.dirname, dir_fd=shared.fd)
            raise FileNotFoundError(f"{self.path.parent} is missing: the legacy adapter needs /proc mounted")
        self.identity: Identity = (st.st_dev, st.st_ino)

    @property
    def path(self) -> Path:
        return Path(f"/proc/self/fd/{self.fd}/{BIND_NAME}")

    def publish(self, mode: int) -> Identity:
        """Give the bound socket ``mode`` and rename it to its name; its identity there."""
        # A name inside our own 0700 directory: nobody else can put anything there.
        os.chmod(BIND_NAME, mode, dir_fd=self.fd)
        st = os.stat(BIND_NAME, dir_fd=self.fd, follow_symlinks=False)
        # rename replaces whatever the other side put at the name, a symlink included, unfollowed.
        os.rename(BIND_NAME, self.name, src_dir_fd=self.fd, dst_dir_fd=self.shared.fd)
        self._remove_dir()
        return (st.st_dev, st.st_ino)

    def _remove_dir(self) -> None:
        # Only if the name is still ours (the other side may have renamed it away: then an empty,
        # root-only directory stays behind under some name of theirs).
        if self.shared.identity(self.dirname) == self.identity:
            with contextlib.suppress(OSError):
                os.rmdir(self.dirname, dir_fd=self.shared.fd)

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(BIND_NAME, dir_fd=self.fd)  # if never published
            self._remove_dir()
            os.close(self.fd)
            self.fd = -1

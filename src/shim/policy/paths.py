"""Host paths as the node's filesystem has them: globs that allow them, where they lead.

What a path leads to is looked up afresh on every check (a symlink can change between two
Allocates); a ``Looks`` holds what one check learnt and is thrown away after it.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Sequence

PROC_DEVICES = "/proc/devices"
_PROC_DEVICES_LIMIT = 64 * 1024  # a few KiB on any kernel


def normal(path: str) -> str:
    """``path`` normalised lexically; normpath keeps a leading '//' (POSIX leaves its meaning
    open), which on Linux is '/'."""
    return "/" + posixpath.normpath(path).lstrip("/")


def glob_regex(pattern: str) -> str:
    """A path glob as a regular expression: ``*`` and ``?`` within one path component,
    ``**`` across components; nothing else is special."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def literal_head(pattern: str) -> str:
    """The components of a glob before its first wildcard: '/run/vendor' of '/run/vendor/*'."""
    head = []
    for part in pattern.split("/"):
        if any(c in part for c in "*?"):
            break
        head.append(part)
    return "/".join(head) or "/"


class Globs:
    """Host path globs an operator wrote. A glob whose fixed head is itself a symlink
    (/var/run/x/* with /var/run -> /run) also allows where that head leads: the operator chose
    the head, and only root on the host could repoint it, so it is resolved once, here."""

    def __init__(self, globs: Sequence[str]) -> None:
        self.shown = ", ".join(globs) or "none"
        self.heads = {literal_head(g) for g in globs}
        patterns = set()
        for glob in globs:
            patterns.add(glob_regex(glob))
            head = literal_head(glob)
            real = os.path.realpath(head)
            if real != head:
                patterns.add(glob_regex(real.rstrip("/") + glob[len(head) :]))
        self._match = re.compile("|".join(f"(?:{p})" for p in sorted(patterns))) if patterns else None

    def __bool__(self) -> bool:
        return self._match is not None

    def cover(self, path: str) -> bool:
        return self._match is not None and self._match.fullmatch(path) is not None


def resolve(path: str, looks: Looks) -> tuple[str, os.stat_result | None, tuple[str, ...]]:
    """Where ``path`` leads, what is there (None: nothing), and the directories of the links
    followed on the way."""
    head, _, tail = path.rpartition("/")
    links: tuple[str, ...] = ()
    if not head or tail in ("", ".", "..") or "//" in path or "/./" in path or "/../" in path:
        real, links = looks.follow(path)
        return real, stat_of(real), links
    parent, links = looks.follow(head)  # each parent resolved once per check
    try:
        here = os.lstat(path)
    except OSError:  # absent (or unreadable): nothing more to follow
        return parent.rstrip("/") + "/" + tail, None, links
    if stat.S_ISLNK(here.st_mode):
        real, links = looks.follow(path)
        return real, stat_of(real), links
    return parent.rstrip("/") + "/" + tail, here, links


def _follow(path: str) -> tuple[str, tuple[str, ...]]:
    """``os.path.realpath(path)`` as the kernel walks it, with the directory of each link on the
    way: whoever may write there may repoint the link."""
    links: list[str] = []
    todo = [name for name in reversed(path.split("/")) if name]
    done = "/"
    while todo:  # ends: at most 40 links are followed, as the kernel allows (ELOOP)
        name = todo.pop()
        if name == "." or name == "..":
            done = posixpath.dirname(done) if name == ".." else done
            continue
        here = posixpath.join(done, name)
        try:
            link = stat.S_ISLNK(os.lstat(here).st_mode)
        except OSError:  # nothing there: the rest as written
            link = False
        if not link or len(links) >= 40:
            done = here
            continue
        links.append(done)
        target = os.readlink(here)
        done = "/" if target.startswith("/") else done
        todo.extend(name for name in reversed(target.split("/")) if name)
    return done, tuple(links)


def stat_of(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def what(found: os.stat_result | None) -> str:
    """What is at a path, as a refusal says it."""
    if found is None:
        return "does not exist"
    mode = found.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "character" if stat.S_ISCHR(mode) else "block"
        return f"is a {kind} device {os.major(found.st_rdev)}:{os.minor(found.st_rdev)}"
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO"),
    ):
        if test(mode):
            return f"is {name}"
    return "is a socket"


class Looks:
    """What one check learnt of the filesystem: never kept past it, since it can change."""

    def __init__(self, proc_devices: str = PROC_DEVICES) -> None:
        self._proc_devices = proc_devices  # where the kernel lists its drivers' majors
        self._followed: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._writable: dict[str, str | None] = {}  # directory -> it or the nearest above it
        # that anyone may write to
        self._majors: dict[str, frozenset[str]] | None = None

    def follow(self, path: str) -> tuple[str, tuple[str, ...]]:
        found = self._followed.get(path)
        if found is None:
            found = self._followed[path] = _follow(path)
        return found

    def world_writable(self, directory: str) -> str | None:
        """``directory`` or the nearest one above it that anyone may write to, if any."""
        walked = []
        while directory not in self._writable:
            walked.append(directory)
            found = stat_of(directory)
            if found is not None and found.st_mode & stat.S_IWOTH:
                self._writable[directory] = directory
                break
            if directory == "/":
                self._writable[directory] = None
                break
            directory = directory.rpartition("/")[0] or "/"
        answer = self._writable[directory]
        for below in walked:
            self._writable[below] = answer
        return answer

    def driver_names(self, kind: int, major: int) -> frozenset[str]:
        """The kernel drivers that hold ``major`` (/proc/devices): how a device whose number the
        kernel hands out at boot (watchdog0, bsg, tpmrm) is known for what it is."""
        if self._majors is None:
            self._majors = read_proc_devices(self._proc_devices)
        return self._majors.get(f"{'c' if kind == stat.S_IFCHR else 'b'} {major}", frozenset())


def read_proc_devices(path: str = PROC_DEVICES) -> dict[str, frozenset[str]]:
    """'c 249' -> {'watchdog'}: each major's driver names; empty where it cannot be read."""
    try:
        with open(path, "rb") as file:
            text = file.read(_PROC_DEVICES_LIMIT).decode("ascii", "replace")
    except OSError:
        return {}
    names: dict[str, set[str]] = {}
    kind = ""
    for line in text.splitlines():
        if line.startswith("Character"):
            kind = "c"
        elif line.startswith("Block"):
            kind = "b"
        elif kind and len(parts := line.split(None, 1)) == 2 and parts[0].isascii() and parts[0].isdigit():
            names.setdefault(f"{kind} {int(parts[0])}", set()).add(parts[1].strip())
    return {k: frozenset(v) for k, v in names.items()}

"""Orphans devshim adopts: reaped when they exit, killed when devshim leaves.

A driver's children that outlive it (a daemon it started, a child its group kill missed) are
re-parented to the nearest subreaper, else to PID 1. devshim is PID 1 in its container (the
image's ENTRYPOINT) and otherwise makes itself a child subreaper (`devshim run` only), so they
come to devshim either way: it reaps each one that exits, so no zombie piles up, and kills those
still running when it leaves, so nothing a driver started outlives devshim.

Drivers themselves are asyncio's children (their exit status matters): their pids are
registered while they are started and run, and never waited for here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Collection, Iterator
from pathlib import Path

from loguru import logger

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def _children(pid: int | str = "self") -> set[int]:
    found: set[int] = set()
    with contextlib.suppress(OSError):  # `pid` gone
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found.update(int(child) for child in (task / "children").read_text().split())
    return found


def descendants(pid: int) -> set[int]:
    """`pid`'s children, theirs and so on, as now: a child in a session of its own included,
    which a group kill misses (once `pid` is gone, they are the subreaper's children)."""
    found: set[int] = set()
    parents = [pid]
    while parents:
        for child in _children(parents.pop()) - found:
            found.add(child)
            parents.append(child)
    return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


class Reaper:
    def __init__(self) -> None:
        self._own: set[int] = set()  # drivers: asyncio waits for them
        self._spawning = 0
        self._deferred = False

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Around starting a driver: until its pid is registered, a zombie might be it."""
        self._spawning += 1
        try:
            yield
        finally:
            self._spawning -= 1
            if not self._spawning and self._deferred:
                self._deferred = False
                self.reap()

    def own(self, pid: int) -> None:
        self._own.add(pid)

    def disown(self, pid: int) -> None:
        """The driver was waited for (its pid may be reused from now on)."""
        self._own.discard(pid)

    def become_subreaper(self) -> bool:
        """Make orphans of this process's descendants its own children (Linux 3.4+)."""
        if os.getpid() == 1:
            return True  # PID 1 adopts every orphan of its namespace already
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
        except (OSError, AttributeError):
            return False

    def adopted(self) -> set[int]:
        return _children() - self._own

    def reap(self) -> int:
        """Wait for every adopted child that has exited (on SIGCHLD); how many were reaped."""
        if self._spawning:
            self._deferred = True
            return 0
        reaped = 0
        for pid in self.adopted():
            if _zombie(pid):
                with contextlib.suppress(ChildProcessError):
                    reaped += os.waitpid(pid, os.WNOHANG)[0] == pid
        return reaped

    def kill_adopted(self, among: Collection[int] | None = None) -> None:
        """devshim is leaving: SIGKILL every adopted child still running, then reap them all.
        `among`: only the adopted children in it (a pid that is our child cannot be reused)."""
        adopted = self.adopted() if among is None else self.adopted() & set(among)
        running = [pid for pid in adopted if not _zombie(pid)]
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if running:
            logger.info("killed {} process(es) drivers left behind: {}", len(running), sorted(running))
        for pid in adopted:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


REAPER = Reaper()

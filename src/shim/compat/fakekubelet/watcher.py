"""The kubelet's plugin manager, faked: it notices registration sockets in plugins_registry.

Follows pkg/kubelet/pluginmanager. The plugin watcher (pluginwatcher/plugin_watcher.go) keeps
the desired state of the world: every socket in the directory tree, each with a fresh token
whenever it is (re-)created. The reconciler (reconciler/reconciler.go) makes the actual state
follow it, first unregistering what vanished or was re-created, then registering what is new;
operationexecutor runs at most one operation per socket path and backs a failing path off
exponentially. The register and unregister operations themselves are callbacks (registrar.py).

One deliberate difference: upstream reconciles once a second; the fake also reconciles at once
when the watcher saw a change, so tests do not wait for the tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Literal, NamedTuple

WatchMode = Literal["auto", "inotify", "poll"]

RECONCILE_INTERVAL_S = 1.0  # plugin_manager.go loopSleepDuration (also the polling interval here)
BACKOFF_INITIAL_S = 0.5  # goroutinemap/exponentialbackoff initialDurationBeforeRetry
BACKOFF_MAX_S = 122.0  # exponentialbackoff maxDurationBeforeRetry (2m2s)


class Outcome(NamedTuple):
    """How a register operation ended: `added` to the actual state of the world, and `failed`."""

    added: bool
    failed: bool


RegisterFn = Callable[[Path], Awaitable[Outcome]]
UnregisterFn = Callable[[Path], Awaitable[None]]


def _is_socket(path: Path) -> bool:
    # pkg/kubelet/util IsUnixDomainSocket: os.Stat, so a link to a socket counts.
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


class PluginWatcher:
    """Watches `directory` (recursively) and registers/unregisters each socket through callbacks."""

    def __init__(
        self, directory: Path, register: RegisterFn, unregister: UnregisterFn, mode: WatchMode = "auto"
    ) -> None:
        self.directory = directory
        self.mode = mode
        self._register = register
        self._unregister = unregister
        self._tokens = itertools.count(1)
        self._desired: dict[Path, int] = {}  # socket path -> token of its latest creation
        self._seen: dict[Path, tuple[int, int]] = {}  # polling: (inode, ctime) behind each token
        self._actual: dict[Path, int] = {}  # registered socket path -> token it was registered with
        self._ops: dict[Path, asyncio.Task[None]] = {}
        self._backoff: dict[Path, tuple[float, float]] = {}  # path -> (retry not before, duration)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.polling = False
        self._stopping = False

    def start(self) -> None:
        """Create the directory, find the sockets already there, then keep watching."""
        # plugin_watcher.go init: MkdirAll, then traversePluginDir before watching events.
        self.directory.mkdir(parents=True, exist_ok=True)
        self.polling = self.mode == "poll" or not _inotify_available()
        if self.mode == "inotify" and self.polling:
            raise RuntimeError("watch mode 'inotify' was asked for, but inotify is not available here")
        if not self.polling:
            self._tasks.append(asyncio.create_task(self._watch_inotify(), name="plugin watcher"))
        self._tasks.append(asyncio.create_task(self._reconcile_loop(), name="plugin reconciler"))

    async def stop(self) -> None:
        self._stopping = True
        tasks = [*self._tasks, *self._ops.values()]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._ops.clear()

    # -- the desired state of the world ---------------------------------------------------------

    def _created(self, path: Path) -> None:
        # plugin_watcher.go handleCreateEvent: names starting with '.' are ignored, directories are
        # traversed, anything that is not a socket is ignored.
        if path.name.startswith("."):
            return
        if path.is_dir() and not path.is_symlink():
            for socket in self._walk(path):
                self._created(socket)
        elif _is_socket(path):
            # AddOrUpdatePlugin: a new token even for a known path (re-created in the meantime).
            self._desired[path] = next(self._tokens)
            self._wake.set()

    def _removed(self, path: Path) -> None:
        # handleDeleteEvent: RemovePlugin(socketPath); a removed directory takes its sockets along.
        for known in [p for p in self._desired if p == path or path in p.parents]:
            del self._desired[known]
        self._wake.set()

    def _walk(self, root: Path) -> Iterator[Path]:
        """Every socket under `root`, as traversePluginDir finds them (descending every directory)."""
        for directory, _dirs, files in os.walk(root):
            for name in files:
                path = Path(directory, name)
                if not name.startswith(".") and _is_socket(path):
                    yield path

    def _poll(self) -> None:
        """The polling fallback: compare a fresh walk with the last one."""
        found: dict[Path, tuple[int, int]] = {}
        for path in self._walk(self.directory):
            with contextlib.suppress(OSError):
                info = path.stat()
                found[path] = (info.st_ino, info.st_ctime_ns)
        for path in [p for p in self._desired if p not in found]:
            del self._desired[path]
        for path, identity in found.items():
            # A path first seen by inotify keeps its token; a changed identity means re-created.
            if path not in self._desired or self._seen.get(path, identity) != identity:
                self._desired[path] = next(self._tokens)
        self._seen = found

    async def _watch_inotify(self) -> None:
        from asyncinotify import Mask, RecursiveInotify

        mask = Mask.CREATE | Mask.DELETE | Mask.MOVED_TO | Mask.MOVED_FROM | Mask.DELETE_SELF
        try:
            with RecursiveInotify() as inotify:
                # plugin_watcher.go Start: the watches are in place before the walk, so a socket
                # created meanwhile is seen by one or the other.
                inotify.add_recursive_watch(self.directory, mask)
                for socket in self._walk(self.directory):
                    self._created(socket)
                while True:
                    try:
                        event = await inotify.get()
                    except (ValueError, FileNotFoundError):
                        # RecursiveInotify could not watch a directory removed before its
                        # creation was read (devshim binds in short-lived private ones);
                        # upstream's handleCreateEvent fails its stat, logs it, and goes on.
                        continue
                    if event.mask & Mask.DELETE_SELF and event.path == self.directory:
                        break  # nothing left to watch: poll until it is back
                    if event.path is None:
                        continue
                    if event.mask & (Mask.CREATE | Mask.MOVED_TO):
                        self._created(event.path)
                    elif event.mask & Mask.DELETE:
                        self._removed(event.path)
                    elif event.mask & (Mask.MOVED_FROM | Mask.DELETE_SELF):
                        # fsnotify calls a move away Rename, which upstream ignores; the fake drops
                        # the sockets that are no longer there.
                        self._removed(event.path)
        except OSError:
            pass  # e.g. out of inotify watches: poll instead, as below
        self.polling = True
        self._wake.set()

    # -- the reconciler ------------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while not self._stopping:
            if self.polling:
                self._poll()
            self._reconcile()
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # arrives as the event is set (an operation ending as stop() cancels it).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECONCILE_INTERVAL_S):
                    await self._wake.wait()
            self._wake.clear()

    def _reconcile(self) -> None:
        # reconciler.go reconcile: unregistrations are triggered before registrations.
        for path, token in list(self._actual.items()):
            if path not in self._ops and self._desired.get(path) != token:
                self._run(path, functools.partial(self._unregister_op, path))
        now = time.monotonic()
        for path, token in list(self._desired.items()):
            if path in self._ops or path in self._actual:
                continue  # an operation is pending (IsAlreadyExists), or it must go first
            if now < self._backoff.get(path, (0.0, 0.0))[0]:
                continue  # exponentialbackoff SafeToRetry refuses
            self._run(path, functools.partial(self._register_op, path, token))

    def _run(self, path: Path, operation: Callable[[], Awaitable[None]]) -> None:
        if not self._stopping:
            self._ops[path] = asyncio.create_task(
                self._guarded(path, operation), name=f"plugin operation {path}"
            )

    async def _guarded(self, path: Path, operation: Callable[[], Awaitable[None]]) -> None:
        # The operation starts inside the task, so a task cancelled before it ran leaves nothing.
        try:
            await operation()
        finally:
            self._ops.pop(path, None)
            self._wake.set()

    async def _register_op(self, path: Path, token: int) -> None:
        outcome = await self._register(path)
        if outcome.added:
            # operation_generator.go adds the plugin to the actual state before RegisterPlugin, so
            # even a failed RegisterPlugin leaves it there and it is not retried.
            self._actual[path] = token
        if outcome.failed:
            _retry_at, duration = self._backoff.get(path, (0.0, 0.0))
            duration = min(duration * 2, BACKOFF_MAX_S) if duration else BACKOFF_INITIAL_S
            self._backoff[path] = (time.monotonic() + duration, duration)
        else:
            self._backoff.pop(path, None)

    async def _unregister_op(self, path: Path) -> None:
        # operation_generator.go GenerateUnregisterPluginFunc: RemovePlugin, then DeRegisterPlugin.
        del self._actual[path]
        await self._unregister(path)


def _inotify_available() -> bool:
    try:
        from asyncinotify import Inotify
    except (ImportError, OSError):  # not Linux, or no inotify in this kernel
        return False
    try:
        Inotify().close()
    except OSError:
        return False
    return True

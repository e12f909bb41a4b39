"""Notices changes in the device-plugins directory: inotify, or polling as a fallback.

The watcher only says "look again" (with the file name when it knows it);
endpoints then check the facts themselves (shim/deviceplugin/endpoint/), so a
late or duplicated event can never cause a wrong re-registration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from loguru import logger

Listener = Callable[[str | None], None]

try:
    from asyncinotify import Inotify, Mask

    INOTIFY = True
    _MASK = Mask.CREATE | Mask.DELETE | Mask.MOVED_FROM | Mask.MOVED_TO | Mask.DELETE_SELF | Mask.MOVE_SELF
except (ImportError, OSError):  # not Linux, or no inotify in this kernel
    INOTIFY = False


class DirWatcher:
    def __init__(
        self, directory: Path, mode: Literal["auto", "inotify", "poll"] = "auto", poll_interval_s: float = 1.0
    ) -> None:
        self.directory = directory
        self.mode = mode
        self.poll_interval_s = poll_interval_s
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _notify(self, name: str | None) -> None:
        for listener in list(self._listeners):
            listener(name)

    async def run(self) -> None:
        if self.mode != "poll" and INOTIFY:
            try:
                await self._run_inotify()
            except OSError as exc:
                if self.mode == "inotify":
                    raise
                logger.warning(
                    "inotify unavailable ({}); polling {} every {}s",
                    exc,
                    self.directory,
                    self.poll_interval_s,
                )
        elif self.mode == "inotify":
            raise RuntimeError("watch_mode 'inotify' was asked for, but inotify is not available here")
        await self._run_polling()

    async def _run_inotify(self) -> None:
        while True:
            self.directory.mkdir(parents=True, exist_ok=True)
            with Inotify() as inotify:
                inotify.add_watch(self.directory, _MASK)
                # Anything that changed before the watch existed.
                self._notify(None)
                async for event in inotify:
                    if event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED):
                        logger.warning("{} was removed; watching it again once re-created", self.directory)
                        self._notify(None)
                        break
                    self._notify(event.name.name if event.name else None)
            await asyncio.sleep(self.poll_interval_s)

    async def _run_polling(self) -> None:
        while True:
            self._notify(None)
            await asyncio.sleep(self.poll_interval_s)

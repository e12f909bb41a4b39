"""Noticing hot-plug: inotify on the glob directories, polling where inotify cannot help.

The watcher only says "scan again"; the scan compares the facts itself, so a
duplicated or spurious wake-up costs one scan and never a wrong list.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from loguru import logger

try:
    from asyncinotify import Inotify, Mask

    INOTIFY = True
    _MASK = (
        Mask.CREATE
        | Mask.DELETE
        | Mask.MOVED_FROM
        | Mask.MOVED_TO
        | Mask.ATTRIB
        | Mask.DELETE_SELF
        | Mask.MOVE_SELF
    )
except (ImportError, OSError):  # not Linux, or no inotify in this kernel
    INOTIFY = False


async def _poll(interval_s: float, wake: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(interval_s)
        wake()


async def watch(
    directories: set[Path],
    deep: bool,
    mode: Literal["auto", "inotify", "poll"],
    interval_s: float,
    wake: Callable[[], None],
) -> None:
    """Call ``wake`` whenever a node may have come or gone, until cancelled."""
    existing = sorted(d for d in directories if d.is_dir())
    if mode != "poll" and INOTIFY and existing:
        try:
            await _inotify(existing, len(existing) < len(directories) or deep, interval_s, wake)
        except OSError as exc:
            if mode == "inotify":
                raise
            logger.warning("inotify unavailable ({}); polling every {} s", exc, interval_s)
    elif mode == "inotify" and not INOTIFY:
        raise RuntimeError("watch_mode 'inotify' was asked for, but inotify is not available here")
    # Also where a watched directory went away: its nodes may come back in a new one.
    await _poll(interval_s, wake)


async def _inotify(
    directories: list[Path], also_poll: bool, interval_s: float, wake: Callable[[], None]
) -> None:
    # A missing directory cannot be watched, and a wildcard in a directory part means changes
    # below the watched one go unseen: polling covers both.
    poller = asyncio.create_task(_poll(interval_s, wake)) if also_poll else None
    try:
        with Inotify() as inotify:
            for directory in directories:
                inotify.add_watch(directory, _MASK)
            wake()  # anything that changed before the watches existed
            async for event in inotify:
                wake()
                if event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED):
                    logger.warning("a watched directory went away; polling every {} s", interval_s)
                    return
    finally:
        if poller is not None:
            poller.cancel()
            await asyncio.wait([poller])  # not `await poller`: our own cancellation must propagate

"""The control file: commands appended to it change the simulator at run time.

The simulator polls the file every 50 ms and runs each new complete line
(lines present when it starts following are skipped):

    health <resource> <id> Healthy|Unhealthy   -> health_changed
    taint <resource> <id> <key> <effect>       -> devices_changed (the device gains the taint)
    untaint <resource> <id>                    -> devices_changed (the device loses its taints)
    count <resource> <n>                       -> devices_changed (the new full list)
    add <resource> <n>                         -> resources_changed (n devices, per-call, empty grant)
    remove <resource>                          -> resources_changed
    log <LEVEL> <message...>                   -> log

Polling rather than inotify: it works on every filesystem and in every
container, and 50 ms is quick enough for tests.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from loguru import logger

from shim.sdk import ConnectionClosed, types

POLL_INTERVAL_S = 0.05
_HEALTH = {"healthy": types.Health.HEALTHY, "unhealthy": types.Health.UNHEALTHY}


class CommandError(ValueError):
    """A command that cannot be applied; the simulator logs it and goes on."""


class Simulator(Protocol):
    """What the commands change (the simulated driver, adapters/sim/driver.py); each raises
    CommandError for a command it cannot apply."""

    async def set_health(self, resource: str, device_id: str, health: types.Health) -> None: ...
    async def set_taints(self, resource: str, device_id: str, taints: list[types.DeviceTaint]) -> None: ...
    async def set_count(self, resource: str, count: int) -> None: ...
    async def add_resource(self, resource: str, count: int) -> None: ...
    async def remove_resource(self, resource: str) -> None: ...
    async def log(self, level: types.LogLevel | str, message: str) -> None: ...


class AppendedLines:
    """The complete lines appended to a file since the last call, like ``tail -f``."""

    def __init__(self, path: Path) -> None:
        self.path = self._path = path
        self._offset = self._size()
        self._partial = b""

    def _size(self) -> int:
        try:
            return self._path.stat().st_size
        except FileNotFoundError:
            return 0

    def read(self) -> list[str]:
        size = self._size()
        if size < self._offset:  # truncated or replaced: start over
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        with self._path.open("rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [text for line in lines if (text := line.decode(errors="replace").strip())]


async def apply(driver: Simulator, line: str) -> None:
    match line.split():
        case ["health", resource, device_id, health]:
            if health.lower() not in _HEALTH:
                raise CommandError(f"health must be Healthy or Unhealthy, not {health!r}")
            await driver.set_health(resource, device_id, _HEALTH[health.lower()])
        case ["taint", resource, device_id, key, effect]:
            await driver.set_taints(resource, device_id, [types.DeviceTaint(key=key, effect=effect)])
        case ["untaint", resource, device_id]:
            await driver.set_taints(resource, device_id, [])
        case ["count", resource, count]:
            await driver.set_count(resource, _count(count))
        case ["add", resource, count]:
            await driver.add_resource(resource, _count(count))
        case ["remove", resource]:
            await driver.remove_resource(resource)
        case ["log", level, _, *_]:
            if level.upper() not in types.LogLevel.__members__:
                raise CommandError(f"unknown log level {level!r}")
            await driver.log(level, line.split(maxsplit=2)[2])
        case _:
            raise CommandError("not a command (see adapters/sim/control.py)")


def _count(text: str) -> int:
    if not (text.isascii() and text.isdigit()):  # '١٢' is no count
        raise CommandError(f"{text!r} is not a device count")
    return int(text)


async def follow(driver: Simulator, lines: AppendedLines) -> None:
    """Apply each new line of the control file until the connection to devshim ends."""
    path = lines.path
    while True:
        await asyncio.sleep(POLL_INTERVAL_S)
        for line in lines.read():
            try:
                await apply(driver, line)
            except CommandError as exc:
                logger.warning("control file {}: ignoring {!r}: {}", path, line, exc)
            except ConnectionClosed:
                return

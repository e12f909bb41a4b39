"""A driver whose device turns Unhealthy on its own, a moment after it starts, as hardware does.

Serves example.com/flip with devices f-0 and f-1; f-1 fails shortly after initialize. With
FLIP_SILENTLY set it only changes what list_devices answers and tells devshim nothing: the bug
compat's health_watch row exists to catch."""

from __future__ import annotations

import asyncio
import os

from shim.sdk import Driver, run, types

RESOURCE = "example.com/flip"


class Flipping(Driver):
    name = "flipping"

    def __init__(self) -> None:
        self.health = {"f-0": types.Health.HEALTHY, "f-1": types.Health.HEALTHY}
        self._tasks: set[asyncio.Task[None]] = set()

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=RESOURCE)]

    async def on_initialize(self, params: types.InitializeParams) -> None:
        task = asyncio.create_task(self._fail_soon())
        self._tasks.add(task)

    async def _fail_soon(self) -> None:
        await asyncio.sleep(0.5)
        self.health["f-1"] = types.Health.UNHEALTHY
        if not os.environ.get("FLIP_SILENTLY"):
            await self.health_changed(RESOURCE, [("f-1", types.Health.UNHEALTHY)])

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=i, health=h) for i, h in self.health.items()]


if __name__ == "__main__":
    run(Flipping())

"""A driver whose Allocate says it has arrived (a log notification), then holds the answer HOLD_S:
a test waits for the arrival, not for a time, to act while the call is in flight."""

from __future__ import annotations

import asyncio

from shim.sdk import Driver, run, types

RESOURCE = "example.com/held"
ARRIVED = "allocate arrived"
# Well under devshim's 5 s grace for unary calls on a closing server (deviceplugin/endpoint/server.py),
# which starts after the arrival: the answer comes within it even on a loaded machine.
HOLD_S = 0.7


class Holding(Driver):
    name = "holding"

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=RESOURCE)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=f"h-{i}", health=types.Health.HEALTHY) for i in range(2)]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        await self.log("INFO", ARRIVED)
        await asyncio.sleep(HOLD_S)
        return [types.Grant() for _ in containers]


if __name__ == "__main__":
    run(Holding())

"""Hot-plug slots: one device per file in $SLOTS_DIR, rescanned in the background (docs/sdk.md).

A file that appears is a device plugged in, a file that goes is a device pulled out, and a file
that reads "fault" is a device still there but broken.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from shim.sdk import ConnectionClosed, Driver, run, types

RESOURCE = "example.com/slot"


class Slots(Driver):
    name = "slots"

    def __init__(self, directory: Path, interval_s: float) -> None:
        self.directory = directory
        self.interval_s = interval_s
        self.health = self.scan()
        self.watching: asyncio.Task[None] | None = None

    def scan(self) -> dict[str, types.Health]:
        found = {}
        for path in sorted(self.directory.iterdir()):
            try:
                broken = path.read_text().strip() == "fault"
            except OSError:  # pulled out while we looked
                continue
            found[path.name] = types.Health.UNHEALTHY if broken else types.Health.HEALTHY
        return found

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=RESOURCE)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=slot, health=health) for slot, health in self.health.items()]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant(envs={"SLOTS": ",".join(ids)}) for ids in containers]

    async def on_initialize(self, params: types.InitializeParams) -> None:
        # devshim accepts notifications from here on.
        self.watching = asyncio.create_task(self.watch())

    async def on_shutdown(self) -> None:
        if self.watching is not None:
            self.watching.cancel()

    async def watch(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                await self.rescan()
        except ConnectionClosed:  # devshim has gone; on_shutdown follows
            pass

    async def rescan(self) -> None:
        before, now = self.health, self.scan()
        self.health = now
        if now.keys() != before.keys():
            # Devices came or went: the full new list. One left out is removed from the node.
            await self.devices_changed(RESOURCE, await self.list_devices(RESOURCE))
            plugged, pulled = sorted(now.keys() - before.keys()), sorted(before.keys() - now.keys())
            await self.log("INFO", f"plugged {plugged}, pulled {pulled}")
            return
        # The same devices: only those whose health changed.
        changes = [(slot, health) for slot, health in now.items() if before[slot] != health]
        if changes:
            await self.health_changed(RESOURCE, changes)
            for slot, health in changes:
                await self.log("WARNING", f"slot {slot} is {health.name}")


def main() -> None:
    # devshim gives a driver no environment but its drivers[] entry's env.
    directory = os.environ.get("SLOTS_DIR")
    if not directory:
        sys.exit("slots: set SLOTS_DIR in the env of the driver's drivers[] entry")
    run(Slots(Path(directory), float(os.environ.get("SLOTS_POLL_S", "1"))))


if __name__ == "__main__":
    main()

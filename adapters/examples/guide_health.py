"""Background health work: each GPU's temperature polled, its health reported as it changes
(docs/sdk.md).

The probe reads hwmon-style files, $THERMAL_DIR/<id> in millidegrees Celsius as
/sys/class/hwmon/hwmon*/temp1_input has them. A GPU at 90 °C or more is unhealthy until it cools
below 85 °C; one whose sensor cannot be read is unhealthy too.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from shim.sdk import ConnectionClosed, Driver, run, types

RESOURCE = "example.com/gpu"
HOT_MC, COOL_MC = 90_000, 85_000


class Thermal(Driver):
    name = "thermal"

    def __init__(self, sensors: Path, ids: list[str], interval_s: float) -> None:
        self.sensors = sensors
        self.interval_s = interval_s
        self.health = dict.fromkeys(ids, types.Health.HEALTHY)
        self.polling: asyncio.Task[None] | None = None

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=RESOURCE)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=gpu, health=health) for gpu, health in self.health.items()]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant(envs={"GPUS": ",".join(ids)}) for ids in containers]

    async def on_initialize(self, params: types.InitializeParams) -> None:
        # One probe before answering, so the first list is already true; then the loop.
        self.health = await asyncio.to_thread(self.probe)
        self.polling = asyncio.create_task(self.poll())

    async def on_shutdown(self) -> None:
        if self.polling is not None:
            self.polling.cancel()

    def probe(self) -> dict[str, types.Health]:
        """Blocking reads, so it runs in a thread: the event loop keeps answering devshim."""
        health = {}
        for gpu, before in self.health.items():
            try:
                millidegrees = int((self.sensors / gpu).read_text())
            except (OSError, ValueError):
                health[gpu] = types.Health.UNHEALTHY
                continue
            if millidegrees >= HOT_MC:
                health[gpu] = types.Health.UNHEALTHY
            elif millidegrees < COOL_MC:
                health[gpu] = types.Health.HEALTHY
            else:  # between the two: as it was, so a GPU near the limit does not flap
                health[gpu] = before
        return health

    async def poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            now = await asyncio.to_thread(self.probe)
            changes = [(gpu, health) for gpu, health in now.items() if self.health[gpu] != health]
            self.health = now
            if changes:
                try:
                    await self.health_changed(RESOURCE, changes)
                except ConnectionClosed:  # devshim has gone; on_shutdown follows
                    return


def main() -> None:
    # devshim gives a driver no environment but its drivers[] entry's env.
    sensors = os.environ.get("THERMAL_DIR")
    if not sensors:
        sys.exit("thermal: set THERMAL_DIR in the env of the driver's drivers[] entry")
    ids = sorted(path.name for path in Path(sensors).iterdir())
    run(Thermal(Path(sensors), ids, float(os.environ.get("THERMAL_POLL_S", "5"))))


if __name__ == "__main__":
    main()

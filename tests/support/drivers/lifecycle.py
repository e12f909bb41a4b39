"""A driver implementing every optional method, reporting each call as a log notification.

Serves example.com/life with devices l-0..l-3; SIGUSR1 flips l-3's health.
"""

from __future__ import annotations

import asyncio
import signal

from shim.sdk import Driver, run, types

RESOURCE = "example.com/life"
IDS = [f"l-{i}" for i in range(4)]


class Lifecycle(Driver):
    name = "lifecycle"

    def __init__(self) -> None:
        self.health = dict.fromkeys(IDS, types.Health.HEALTHY)

    def resources(self) -> list[types.Resource]:
        return [
            types.Resource(
                name=RESOURCE, preferred_allocation=True, prestart=True, deallocate=True, post_stop=True
            )
        ]

    async def on_initialize(self, params: types.InitializeParams) -> None:
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGUSR1, lambda: asyncio.create_task(self._flip())
        )

    async def _flip(self) -> None:
        last = IDS[-1]
        healthy = self.health[last] == types.Health.HEALTHY
        self.health[last] = types.Health.UNHEALTHY if healthy else types.Health.HEALTHY
        await self.health_changed(RESOURCE, [(last, self.health[last])])

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=i, health=self.health[i], numa_nodes=[n % 2]) for n, i in enumerate(IDS)]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant(envs={"LIFE": ",".join(ids)}) for ids in containers]

    async def preferred_allocation(self, resource: str, request: types.PreferenceRequest) -> list[str]:
        rest = [i for i in request.available if i not in request.must_include]
        return [*request.must_include, *rest][: request.size]

    async def prestart(self, resource: str, device_ids: list[str]) -> None:
        await self.log("INFO", f"call prestart {','.join(device_ids)}")

    async def deallocate(self, resource: str, device_ids: list[str]) -> None:
        await self.log("INFO", f"call deallocate {','.join(sorted(device_ids))}")

    async def post_stop(self, resource: str, device_ids: list[str]) -> None:
        await self.log("INFO", f"call post_stop {','.join(sorted(device_ids))}")


if __name__ == "__main__":
    run(Lifecycle())

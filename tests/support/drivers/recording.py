"""A driver that declares deallocate and reports each call as a log notification."""

from __future__ import annotations

from shim.sdk import Driver, run, types

RESOURCE = "example.com/rec"


class Recording(Driver):
    name = "recording"

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=RESOURCE, deallocate=True)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=f"r-{i}", health=types.Health.HEALTHY) for i in range(4)]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant(envs={"REC": ",".join(ids)}) for ids in containers]

    async def deallocate(self, resource: str, device_ids: list[str]) -> None:
        await self.log("INFO", f"deallocated {','.join(device_ids)}")


if __name__ == "__main__":
    run(Recording())

"""A driver that declares preferred_allocation and prestart but implements neither (-32601)."""

from __future__ import annotations

from shim.sdk import Driver, run, types


class Overpromising(Driver):
    name = "overpromising"

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name="example.com/over", preferred_allocation=True, prestart=True)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=f"o-{i}", health=types.Health.HEALTHY) for i in range(3)]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant(envs={"OVER": ",".join(ids)}) for ids in containers]


if __name__ == "__main__":
    run(Overpromising())

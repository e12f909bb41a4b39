from shim.sdk import Driver, run, types


class Fans(Driver):
    name = "fans"

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name="example.com/fan")]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=f"fan{i}", health=types.Health.HEALTHY) for i in range(4)]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant(envs={"FANS": ",".join(ids)}) for ids in containers]


if __name__ == "__main__":
    run(Fans())

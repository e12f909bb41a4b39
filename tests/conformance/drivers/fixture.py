"""The conformance fixture written with the Python SDK: the driver tests/conformance/README.md
describes, which the Go SDK's fixture (sdk/go/internal/fixture) implements too, so both SDKs
answer the same exact transcripts (vectors/fixture.json)."""

from __future__ import annotations

import sys

from shim.sdk import Driver, UnknownDevice, run, types
from shim.sdk.errors import NotImplementedByResource

CONF = "example.com/conf"
DECLARED = "example.com/conf-declared"
IDS = ("conf-0", "conf-1", "conf-2", "conf-3")
MAINTENANCE = types.DeviceTaint(key="conf.example.com/maintenance", value="soon", effect="NoSchedule")


def node(device_id: str) -> types.DeviceNode:
    return types.DeviceNode(container_path=f"/dev/conf/{device_id}", host_path="/dev/null", permissions="rw")


class Fixture(Driver):
    name = "conformance"
    version = "1.0.0"

    def __init__(self) -> None:
        self.health = {i: types.Health.HEALTHY for i in IDS} | {"conf-3": types.Health.UNHEALTHY}

    def resources(self) -> list[types.Resource]:
        return [
            types.Resource(
                name=CONF, preferred_allocation=True, prestart=True, deallocate=True, post_stop=True
            ),
            types.Resource(name=DECLARED),
        ]

    async def list_devices(self, resource: str) -> list[types.Device]:
        if resource == DECLARED:
            mount = types.Mount(container_path="/opt/conf", host_path="/opt/conf", read_only=True)
            return [
                types.Device(
                    id=i,
                    health=types.Health.HEALTHY,
                    grant=types.Grant(envs={"CONF_DECLARED": i}, mounts=[mount]),
                )
                for i in ("decl-0", "decl-1")
            ]
        return self.listed()

    def listed(self) -> list[types.Device]:
        return [
            types.Device(
                id=i,
                health=self.health[i],
                numa_nodes=[n // 2],
                attributes={
                    "index": types.Attribute(int=n),
                    "model": types.Attribute(string="conf"),
                    "ecc": types.Attribute(bool=True),
                    "firmware": types.Attribute(version="1.2.3"),
                },
                capacity={"memory": "16Gi"},
                # Protocol 1.3: conf-0 is going into maintenance.
                taints=[MAINTENANCE] if i == "conf-0" else [],
            )
            for n, i in enumerate(IDS)
        ]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        if resource != CONF:
            raise NotImplementedByResource(resource, "allocate")
        for ids in containers:
            for i in ids:
                if i not in self.health:
                    raise UnknownDevice(resource, i)
        return [
            types.Grant(
                envs={"CONF_DEVICES": ",".join(ids)},
                device_nodes=[node(i) for i in ids],
                cdi_devices=[f"{CONF}={i}" for i in ids],
            )
            for ids in containers
        ]

    async def preferred_allocation(self, resource: str, request: types.PreferenceRequest) -> list[str]:
        chosen = list(request.must_include)
        for i in request.available:
            if len(chosen) >= request.size:
                break
            if i not in chosen:
                chosen.append(i)
        return chosen

    async def prestart(self, resource: str, device_ids: list[str]) -> None:
        if "conf-1" in device_ids:
            await self.resources_changed()

    async def post_stop(self, resource: str, device_ids: list[str]) -> None:
        if "conf-2" in device_ids:
            self.health["conf-2"] = types.Health.UNHEALTHY
            await self.health_changed(CONF, [("conf-2", types.Health.UNHEALTHY)])
            await self.log("WARNING", "conf-2 stopped unhealthy")

    async def deallocate(self, resource: str, device_ids: list[str]) -> None:
        if "conf-3" in device_ids:
            self.health["conf-3"] = types.Health.HEALTHY
            await self.devices_changed(CONF, self.listed())

    def cdi_specs(self) -> list[types.CdiSpec]:
        devices = [types.CdiSpecDevice(name=i, edits=types.CdiEdits(device_nodes=[node(i)])) for i in IDS]
        return [types.CdiSpec(kind=CONF, devices=devices)]

    async def on_initialize(self, params: types.InitializeParams) -> None:
        for allocation in params.allocations:
            print("in use:", allocation.resource, ",".join(allocation.device_ids), file=sys.stderr)


if __name__ == "__main__":
    run(Fixture())

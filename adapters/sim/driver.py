"""The simulated driver: the SDK's Driver over configured resources, changed at run time
through a control file (adapters/sim/control.py)."""

from __future__ import annotations

import asyncio

from loguru import logger

from shim.sdk import DEVSHIM_VERSION, Driver, types

from .config import ResourceConfig, SimConfig
from .control import AppendedLines, CommandError, follow
from .resource import SimResource


class SimDriver(Driver):
    name = "devshim-sim"
    version = DEVSHIM_VERSION

    def __init__(self, config: SimConfig) -> None:
        self._config = config
        self._resources = {r.name: SimResource(r) for r in config.resources}
        self._control: asyncio.Task[None] | None = None

    def _get(self, name: str) -> SimResource:
        try:
            return self._resources[name]
        except KeyError:
            raise CommandError(f"no resource {name!r}") from None

    # --- the protocol ---------------------------------------------------------

    def resources(self) -> list[types.Resource]:
        return [r.message() for r in self._resources.values()]

    def implements(self, method: str) -> bool:
        """Every optional method is here, but the simulator has one only where its config declares
        it: no warning at start that an unused one will never be called."""
        return any(getattr(r.config, method, False) for r in self._resources.values())

    def cdi_specs(self) -> list[types.CdiSpec]:
        return [spec for r in self._resources.values() if (spec := r.cdi_spec()) is not None]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return self._resources[resource].device_messages()

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        sim = self._resources[resource]
        await _pause(sim.config.delays.allocate_s)
        return [sim.grant(ids) for ids in containers]

    async def admin_access(self, resource: str, device_ids: list[str]) -> types.Grant:
        sim = self._resources[resource]
        sim.check(device_ids)
        return sim.grant(device_ids)

    async def shares(self, resource: str, shares: list[types.DeviceShare]) -> types.Grant:
        return await self.admin_access(resource, [s.device_id for s in shares])

    async def attach(
        self, resource: str, device_id: str, claim: str, claim_uid: str
    ) -> list[types.BindingCondition]:
        logger.info("{}: attaching {} for claim {}", resource, device_id, claim)
        return self._resources[resource].attached(device_id)

    async def detach(self, resource: str, device_id: str, claim: str, claim_uid: str) -> None:
        logger.info("{}: detaching {}, claim {}'s allocation gone", resource, device_id, claim)

    async def preferred_allocation(self, resource: str, request: types.PreferenceRequest) -> list[str]:
        sim = self._resources[resource]
        await _pause(sim.config.delays.preferred_allocation_s)
        return sim.prefer(request)

    async def prestart(self, resource: str, device_ids: list[str]) -> None:
        sim = self._resources[resource]
        await _pause(sim.config.delays.prestart_s)
        sim.check(device_ids)

    async def deallocate(self, resource: str, device_ids: list[str]) -> None:
        self._resources[resource].check(device_ids)

    async def post_stop(self, resource: str, device_ids: list[str]) -> None:
        self._resources[resource].check(device_ids)

    async def on_initialize(self, params: types.InitializeParams) -> None:
        # A real driver would rebuild its bookkeeping here; the simulator only says what it was told.
        for allocation in params.allocations:
            logger.info("{}: in use at start: {}", allocation.resource, ", ".join(allocation.device_ids))
        if self._config.control_file is not None and self._control is None:
            # Where the file ends now, before initialize is answered: lines appended once devshim
            # has the answer are commands, however late the task first runs.
            lines = AppendedLines(self._config.control_file)
            self._control = asyncio.create_task(follow(self, lines))

    async def on_shutdown(self) -> None:
        if self._control is not None:
            self._control.cancel()
            await asyncio.wait([self._control])  # not `await`: our own cancellation must propagate

    # --- control-file commands --------------------------------------------------

    async def set_health(self, resource: str, device_id: str, health: types.Health) -> None:
        sim = self._get(resource)
        device = sim.devices.get(device_id)
        if device is None:
            raise CommandError(f"{resource} has no device {device_id!r}")
        device.health = health
        await self.health_changed(resource, [(device_id, health)])

    async def set_taints(self, resource: str, device_id: str, taints: list[types.DeviceTaint]) -> None:
        sim = self._get(resource)
        device = sim.devices.get(device_id)
        if device is None:
            raise CommandError(f"{resource} has no device {device_id!r}")
        before, device.taints = device.taints, taints
        try:
            messages = sim.device_messages()
            await self.devices_changed(resource, messages)
        except ValueError as exc:  # a taint devshim would refuse: the list is not sent
            device.taints = before
            raise CommandError(str(exc)) from None

    async def set_count(self, resource: str, count: int) -> None:
        sim = self._get(resource)
        sim.resize(count)
        await self.devices_changed(resource, sim.device_messages())

    async def add_resource(self, resource: str, count: int) -> None:
        if resource in self._resources:
            raise CommandError(f"{resource} is served already")
        try:
            config = ResourceConfig(name=resource, count=count)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise CommandError(str(exc)) from None
        self._resources[resource] = SimResource(config)
        await self.resources_changed()

    async def remove_resource(self, resource: str) -> None:
        self._get(resource)
        del self._resources[resource]
        await self.resources_changed()


async def _pause(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)

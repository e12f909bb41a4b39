"""One resource of a driver, as a device source for the core."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from loguru import logger

from shim import grants
from shim.driverhost import protocol
from shim.errors import ShimError
from shim.latest import Latest
from shim.model import (
    Capabilities,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    Health,
    PreferredAllocationRequest,
)
from shim.sources.base import DeviceSource

Call = Callable[[str, Any], Awaitable[Any]]


class DriverSource(DeviceSource):
    def __init__(self, info: protocol.ResourceInfo, call: Call) -> None:
        self.info = info
        self._call = call
        self._latest: Latest[tuple[Device, ...]] = Latest()
        self._declared: dict[str, ContainerGrant] = {}

    @property
    def name(self) -> str:
        return self.info.name

    def capabilities(self) -> Capabilities:
        return self.info.capabilities

    async def list_devices(self) -> tuple[Device, ...]:
        return self._latest.value or ()

    async def watch(self) -> AsyncGenerator[tuple[Device, ...], None]:
        async for devices in self._latest.follow():
            yield devices

    # --- updates from the driver ----------------------------------------

    async def refresh(self) -> None:
        result = await self._call("list_devices", {"resource": self.name})
        await self.set_devices(protocol.devices_from_json(result))

    async def set_devices(self, devices: Sequence[tuple[Device, ContainerGrant | None]]) -> None:
        self._declared = {d.id: g for d, g in devices if g is not None}
        await self._latest.publish(tuple(d for d, _ in devices))

    async def set_health(self, changes: dict[str, Health]) -> None:
        current = self._latest.value or ()
        unknown = set(changes) - {d.id for d in current}
        if unknown:
            logger.warning("{}: health_changed names unknown devices {}", self.name, sorted(unknown))
        await self._latest.publish(tuple(replace(d, health=changes.get(d.id, d.health)) for d in current))

    async def all_unhealthy(self) -> None:
        """The driver is gone: keep every device listed, as Unhealthy (never dropped)."""
        current = self._latest.value or ()
        await self._latest.publish(tuple(replace(d, health=Health.UNHEALTHY) for d in current))

    # --- calls from the core ---------------------------------------------

    async def allocate(self, requests: Sequence[ContainerAllocateRequest]) -> list[ContainerGrant]:
        declared = self._declared
        if all(i in declared for r in requests for i in r.device_ids):
            # Every device declared its grant at list time: no round trip.
            return [grants.merge(declared[i] for i in r.device_ids) for r in requests]
        result = await self._call("allocate", protocol.allocate_params(self.name, requests))
        return protocol.grants_from_json(result, len(requests))

    async def preferred_allocation(self, request: PreferredAllocationRequest) -> Sequence[str]:
        try:
            result = await self._call("preferred_allocation", protocol.preferred_params(self.name, request))
            return protocol.preference_from_json(result)
        except ShimError as exc:
            # Optional advice: without it the kubelet (and the core) choose themselves,
            # which beats failing pod admission because one driver is slow.
            logger.warning("{}; choosing without the driver's preference", exc)
            return ()

    async def prestart(self, device_ids: Sequence[str]) -> None:
        try:
            await self._call("prestart", {"resource": self.name, "device_ids": list(device_ids)})
        except protocol.CapabilityAbsent as exc:
            # Declared but not implemented: nothing to prepare, so the container may start.
            logger.warning("{}; treating pre-start as not needed", exc)

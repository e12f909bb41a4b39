"""A device source whose devices and grant come from settings.

Useful on its own for simple devices that need no driver, and the seam tests
use to change devices under a running shim (``set_health``, ``set_devices``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shim import grants
from shim.model import (
    Capabilities,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    Health,
    PreferredAllocationRequest,
)
from shim.settings import StaticSourceSettings
from shim.sources.base import DeviceSource


class StaticSource(DeviceSource):
    def __init__(
        self,
        devices: Iterable[Device],
        grant: grants.GrantSettings | None = None,
        capabilities: Capabilities | None = None,
    ) -> None:
        self._devices = tuple(devices)
        template = grant or grants.GrantSettings()
        # One grant object per device-ID tuple: its verdict and encoding are kept by identity.
        # The template never changes for this source (a changed config builds a new source).
        self._grants = grants.ByDevices(lambda ids: grants.expand(template, ids))
        self._capabilities = capabilities or Capabilities(preferred_allocation=True)
        self._shown = self._devices

    @classmethod
    def from_settings(cls, settings: StaticSourceSettings) -> StaticSource:
        if settings.devices is not None:
            devices = [
                Device(d.id, Health.HEALTHY if d.healthy else Health.UNHEALTHY, tuple(d.numa_nodes))
                for d in settings.devices
            ]
        else:
            devices = [Device(f"{settings.id_prefix}{n}") for n in range(settings.count or 0)]
        caps = Capabilities(preferred_allocation=settings.preferred_allocation, pre_start=settings.pre_start)
        return cls(devices, settings.grant, caps)

    def capabilities(self) -> Capabilities:
        return self._capabilities

    async def set_devices(self, devices: Iterable[Device]) -> None:
        """Replace the whole list (a device left out is gone from the node)."""
        self._devices = self._shown = tuple(devices)
        if self._sink is not None:
            await self._sink(self._devices)

    async def set_health(self, device_id: str, health: Health) -> None:
        if device_id not in {d.id for d in self._devices}:
            raise KeyError(device_id)
        await self.set_devices(
            Device(d.id, health, d.numa_nodes) if d.id == device_id else d for d in self._devices
        )

    async def allocate(self, requests: Sequence[ContainerAllocateRequest]) -> list[ContainerGrant]:
        return [self._grants.get(r.device_ids) for r in requests]

    async def preferred_allocation(self, request: PreferredAllocationRequest) -> list[str]:
        """Must-include first, then devices sharing their NUMA nodes, then the rest in order."""
        numa = {d.id: d.numa_nodes for d in self._devices}
        wanted = set().union(*(numa.get(i, ()) for i in request.must_include))
        rest = [i for i in request.available if i not in request.must_include]
        rest.sort(key=lambda i: not wanted.intersection(numa.get(i, ())))
        return [*request.must_include, *rest][: request.size]

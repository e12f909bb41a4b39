"""The interface between the core and whatever supplies a resource's devices."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Sequence

from shim.model import (
    Capabilities,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    Health,
    PreferredAllocationRequest,
)


class DeviceSource(ABC):
    """Supplies the devices of one extended resource.

    Request validation (unknown or unhealthy IDs, allocation sizes) is done by
    the core before a source is called; sources only do the device work.
    Optional behaviours are declared in ``capabilities()`` once, and the core
    calls ``preferred_allocation``/``prestart`` only when declared.
    """

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abstractmethod
    async def list_devices(self) -> tuple[Device, ...]:
        """The current full device list."""

    @abstractmethod
    def watch(self) -> AsyncGenerator[tuple[Device, ...], None]:
        """Yield the current full list at once, then a full new list on every change."""

    @abstractmethod
    async def allocate(self, requests: Sequence[ContainerAllocateRequest]) -> Sequence[ContainerGrant]:
        """One grant per container request, in order."""

    def recovering_health(self, device_id: str) -> Health | None:
        """While the source is briefly down (a driver restarting) its devices are listed as
        Unhealthy; this is a device's health from before, so the core can still let a
        container have a device that was Healthy a moment ago. None when the source is up."""
        return None

    async def preferred_allocation(self, request: PreferredAllocationRequest) -> Sequence[str]:
        """IDs this source prefers; the core enforces size and must-include."""
        return ()

    async def deallocate(self, device_ids: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """These devices, allocated together, are free again (no container holds them)."""

    async def post_stop(self, device_ids: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """A container using these devices stopped (v1beta2's PostStopContainer)."""

    async def prestart(self, device_ids: Sequence[str]) -> None:  # noqa: B027 - optional hook
        """Prepare devices before a container starts (only if capabilities say so)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release whatever the source holds."""

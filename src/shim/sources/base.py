"""The interface between the core and whatever supplies a resource's devices."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence

from shim.errors import SourceFailed
from shim.model import (
    BindingCondition,
    Capabilities,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    DeviceBinding,
    Health,
    PreferredAllocationRequest,
)

# Where a source's lists go: the resource (core/resource.py), one call per list, in order.
DeviceSink = Callable[[tuple[Device, ...]], Awaitable[None]]


class DeviceSource(ABC):
    """Supplies the devices of one extended resource.

    Request validation (unknown or unhealthy IDs, allocation sizes) is done by
    the core before a source is called; sources only do the device work.
    Optional behaviours are declared in ``capabilities()`` once, and the core
    calls ``preferred_allocation``/``prestart`` only when declared.
    """

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    _shown: tuple[Device, ...] | None = None  # the list as the kubelet must see it now
    _sink: DeviceSink | None = None

    async def list_devices(self) -> tuple[Device, ...]:
        """The current full device list."""
        return self._shown or ()

    async def feed(self, sink: DeviceSink) -> None:
        """From now on every list goes straight to ``sink``: the one held now at once, if any,
        then each new one as the source makes it (it sets ``_shown`` and awaits ``_sink``
        itself). One hop: no mailbox and no task between the source and its resource."""
        self._sink = sink
        if self._shown is not None:
            await sink(self._shown)

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

    async def attach(
        self, device_id: str, claim: str, claim_uid: str, binding: DeviceBinding
    ) -> tuple[BindingCondition, ...]:
        """Attach a device with a binding, allocated to ``claim`` (only if capabilities say
        attach); how each of its binding conditions stands."""
        raise SourceFailed(f"{device_id!r} has binding conditions but its source cannot attach")

    async def detach(self, device_id: str, claim: str, claim_uid: str) -> None:  # noqa: B027
        """Undo ``attach`` once the claim's allocation is gone (only if capabilities say attach)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release whatever the source holds."""

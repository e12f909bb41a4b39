"""What each front end may ask of a served resource: the core's side of the seam.

The device-plugin front end (deviceplugin/) and the DRA front end (dra/) are typed against these
protocols, not against the concrete ResourceService (core/resource.py), as the kubelet's device
manager owns the interfaces its endpoints are typed against (devicemanager/types.go): a front end
sees the calls its API makes, nothing more. ResourceService provides both; mypy checks that it does.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Protocol

from shim.model import (
    BindingCondition,
    Capabilities,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    DeviceShare,
    PreferredAllocationRequest,
)


class PluginResource(Protocol):
    """One extended resource, as the device plugin API serves it."""

    name: str

    def capabilities(self) -> Capabilities: ...
    def watch(self) -> AsyncGenerator[tuple[Device, ...], None]: ...
    async def allocate(self, requests: Sequence[ContainerAllocateRequest]) -> list[ContainerGrant]: ...
    async def preferred_allocation(self, request: PreferredAllocationRequest) -> tuple[str, ...]: ...
    async def prestart(self, device_ids: Sequence[str]) -> None: ...
    async def post_stop(self, device_ids: Sequence[str]) -> None: ...
    async def deallocate_now(self, device_ids: Sequence[str]) -> None: ...
    async def deallocate(self, device_ids: Sequence[str]) -> None: ...
    async def plugin_listed(self, device_ids: Iterable[str]) -> None: ...


class ClaimResource(Protocol):
    """One resource whose devices DRA publishes and prepares claims on."""

    name: str

    @property
    def devices(self) -> tuple[Device, ...]: ...
    @property
    def dra_devices(self) -> tuple[Device, ...]: ...
    def watch(self) -> AsyncGenerator[tuple[Device, ...], None]: ...
    def watch_dra(self) -> AsyncGenerator[tuple[Device, ...], None]: ...
    async def serve_dra(
        self, claims: dict[str, str], listed: Iterable[str], shares: dict[str, set[str]] | None = None
    ) -> None: ...
    async def prepare(
        self,
        device_ids: Sequence[str],
        claim: str = "a claim",
        *,
        admin_access: bool = False,
        shares: tuple[DeviceShare, ...] = (),
    ) -> ContainerGrant: ...
    async def unprepare(
        self,
        device_ids: Sequence[str],
        claim: str,
        *,
        admin_access: bool = False,
        shares: tuple[DeviceShare, ...] = (),
    ) -> None: ...
    async def claim_gone(self, device_ids: Sequence[str], claim: str) -> None: ...
    async def attach(self, device_id: str, claim: str, claim_uid: str) -> tuple[BindingCondition, ...]: ...
    async def detach(self, device_id: str, claim: str, claim_uid: str) -> None: ...

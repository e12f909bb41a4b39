"""The class a driver author subclasses: the driver protocol's methods as Python methods.

Required: ``resources`` and ``list_devices``; ``allocate`` too unless every
device of the driver declares its grant (devshim then never calls it). The
other methods are optional, and devshim calls one only for a resource whose
flag of the same name is set (``types.Resource(name=..., prestart=True)``).
One the subclass leaves alone answers -32601, which devshim reads as
"capability absent", so a Resource that declares it by mistake degrades
instead of failing pods. Either mismatch is warned about on stderr at
initialize (server.capability_mismatches).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

from shim.jsonrpc import ConnectionClosed, Peer
from shim.sdk.codec import device_json, health_json, log_level_json, message_json
from shim.sdk.errors import NotImplementedByResource
from shim.sdk.generated.devshim.driver import v1 as types

OPTIONAL_METHODS = (
    "preferred_allocation",
    "prestart",
    "deallocate",
    "post_stop",
    "admin_access",
    "shares",
    "attach",
)


class Driver(abc.ABC):
    # Reported to devshim in the initialize answer (DriverInfo); name defaults to the class name.
    name: ClassVar[str] = ""
    version: ClassVar[str] = "0.0.0"

    # Set by serve(); a class default so a subclass __init__ need not call super().__init__().
    _peer: Peer | None = None

    # --- requests devshim sends ---------------------------------------------

    @abc.abstractmethod
    def resources(self) -> list[types.Resource]:
        """The resources served now, with the optional methods each declares.

        Called for every request (to check its resource), so keep it cheap."""

    @abc.abstractmethod
    async def list_devices(self, resource: str) -> list[types.Device]:
        """The full device list of ``resource``."""

    def cdi_specs(self) -> list[types.CdiSpec]:
        """The CDI specs this driver ships (protocol 1.2): devshim writes them into the node's CDI
        folder at every initialize, so the CDI names its grants give (``kind=name``) resolve in
        the container runtime. Each device's ``edits`` (envs, mounts, device nodes) are held to
        the driver's grant policy, its kind to the policy's ``cdi_kinds``. None by default."""
        return []

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        """One grant per container request, in order."""
        raise NotImplementedByResource(resource, "allocate")

    async def preferred_allocation(self, resource: str, request: types.PreferenceRequest) -> list[str]:
        """``request.size`` device IDs from ``available``, every one of ``must_include`` among them."""
        raise NotImplementedByResource(resource, "preferred_allocation")

    async def prestart(self, resource: str, device_ids: list[str]) -> None:
        raise NotImplementedByResource(resource, "prestart")

    async def deallocate(self, resource: str, device_ids: list[str]) -> None:
        raise NotImplementedByResource(resource, "deallocate")

    async def post_stop(self, resource: str, device_ids: list[str]) -> None:
        raise NotImplementedByResource(resource, "post_stop")

    async def admin_access(self, resource: str, device_ids: list[str]) -> types.Grant:
        """A DRA claim with admin access asks for these devices (protocol 1.3): they may be in use
        by other claims and stay theirs, so grant what monitoring or management needs and take
        nothing; no prestart or deallocate follows. Called for a resource with
        ``admin_access=True`` (an allocate request whose container says ``admin_access``)."""
        raise NotImplementedByResource(resource, "admin_access")

    async def shares(self, resource: str, shares: list[types.DeviceShare]) -> types.Grant:
        """Claims share these devices (protocol 1.3, DRA consumable capacity): one share each, its
        ``share_id`` and the capacity it consumes. Grant what the share needs (a memory limit, a
        client slot); the device stays with its other shares, and no prestart or deallocate
        follows. Called for a resource with ``shares=True`` whose devices set
        ``allow_multiple_allocations``."""
        raise NotImplementedByResource(resource, "shares")

    async def attach(
        self, resource: str, device_id: str, claim: str, claim_uid: str
    ) -> list[types.BindingCondition]:
        """The scheduler allocated this device, which has a ``binding`` (protocol 1.4, DRA binding
        conditions), to ``claim`` ("namespace/name"): attach it (over a fabric, say) and answer
        how its binding conditions stand. devshim writes them into the claim's status; the pod
        binds once every condition is True, and is placed again elsewhere if a failure condition
        is. Called once per allocation, for a resource with ``attach=True``."""
        raise NotImplementedByResource(resource, "attach")

    async def detach(self, resource: str, device_id: str, claim: str, claim_uid: str) -> None:  # noqa: B027
        """The allocation ``attach`` was called for is gone (the claim freed or deleted, whether or
        not a pod ever used the device): undo what attach did. devshim asks until it is answered,
        also after a restart, so a detach of a device not attached must simply succeed."""

    # The two hooks do nothing unless overridden: optional, so not abstract.
    async def on_initialize(self, params: types.InitializeParams) -> None:  # noqa: B027
        """Before answering initialize: ``params.allocations`` lists the devices in use,
        so a restarted driver can rebuild its state. Start background work here: devshim
        accepts notifications from now on."""

    async def on_shutdown(self) -> None:  # noqa: B027
        """Once, on shutdown or when devshim goes away: stop background work, release hardware."""

    def implements(self, method: str) -> bool:
        """Whether this subclass overrides the optional ``method``."""
        return getattr(type(self), method) is not getattr(Driver, method)

    @property
    def display_name(self) -> str:
        return self.name or type(self).__name__

    # --- notifications to devshim -------------------------------------------

    async def devices_changed(self, resource: str, devices: Sequence[types.Device]) -> None:
        """The full new device list of ``resource``."""
        await self._notify(
            "devices_changed", {"resource": resource, "devices": [device_json(d) for d in devices]}
        )

    async def health_changed(self, resource: str, changes: Sequence[tuple[str, types.Health]]) -> None:
        """Only the devices whose health changed: cheaper than a full list for large inventories."""
        await self._notify(
            "health_changed",
            {"resource": resource, "changes": [{"id": i, "health": health_json(h)} for i, h in changes]},
        )

    async def resources_changed(self) -> None:
        """Sends the full current ``resources()``; devshim lists a new resource's devices next."""
        await self._notify("resources_changed", {"resources": [message_json(r) for r in self.resources()]})

    async def log(self, level: types.LogLevel | str, message: str) -> None:
        """A line for devshim's log; ``level`` is a LogLevel or its name ("WARNING")."""
        if isinstance(level, str):
            if level.upper() not in types.LogLevel.__members__:
                raise ValueError(f"unknown log level {level!r}")
            level = types.LogLevel[level.upper()]
        await self._notify("log", {"level": log_level_json(level), "message": message})

    async def _notify(self, method: str, params: dict[str, Any]) -> None:
        if self._peer is None or self._peer.closed:
            raise ConnectionClosed(f"{self.display_name}: not connected to devshim, cannot send {method}")
        await self._peer.notify(method, params)

    def _attach(self, peer: Peer | None) -> None:
        self._peer = peer

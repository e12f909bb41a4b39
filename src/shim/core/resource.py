"""One resource's inventory and the rules every API version shares.

The front end calls this; it calls the device source. It keeps the latest
device list, fans it out to every watcher, and checks each request against
that list before the source sees it, so every source gets the same guard.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence

from loguru import logger

from shim import revision
from shim.core.holds import Holds
from shim.errors import (
    GrantRefused,
    RequestError,
    SourceFailed,
    SourceTimeout,
    SourceUnavailable,
    UnhealthyDevice,
    UnknownDevice,
)
from shim.facts import PRESTART_TIMEOUT_S
from shim.latest import Latest
from shim.model import (
    BindingCondition,
    Capabilities,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    DeviceShare,
    Health,
    PreferredAllocationRequest,
)
from shim.ops import metrics
from shim.policy import GrantPolicy
from shim.sources.base import DeviceSource

_ID = operator.attrgetter("id")
_HEALTH = operator.attrgetter("health")


class ResourceService:
    def __init__(
        self,
        name: str,
        source: DeviceSource,
        *,
        prestart_timeout_s: float = PRESTART_TIMEOUT_S,
        on_allocated: Callable[[str, list[str]], None] | None = None,
        on_released: Callable[[str, list[str]], None] | None = None,
        policy: GrantPolicy | None = None,
        driver: str | None = None,
    ) -> None:
        self.name = name
        self.source = source
        # Every grant of every source is held to it; the default allows nothing (and holds the floor).
        self.policy = policy or GrantPolicy(name)
        self._granter = f"driver {driver!r}" if driver else "the static grant"
        self._on_allocated = on_allocated
        self._on_released = on_released
        self._prestart_timeout_s = prestart_timeout_s
        self._devices: tuple[Device, ...] = ()
        self._by_id: dict[str, Device] = {}
        self._healthy = 0  # of _devices
        self._latest: Latest[tuple[Device, ...]] = Latest()  # as the device plugin lists them
        # Served through DRA too (serve_dra): who holds which device, and DRA's view of the list.
        self.holds: Holds | None = None
        self._dra_devices: tuple[Device, ...] = ()
        self._dra_latest: Latest[tuple[Device, ...]] = Latest()
        self._first_list = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()

    # --- lifecycle -------------------------------------------------------

    async def start(self, first_list_timeout_s: float = 30.0) -> None:
        """Take the source's lists; return once the first is in (a kubelet gets a full list at once)."""
        await self.source.feed(self._take)
        try:
            async with asyncio.timeout(first_list_timeout_s):
                await self._first_list.wait()
        except TimeoutError:
            raise SourceUnavailable(
                f"{self.name}: device source gave no device list within {first_list_timeout_s}s"
            ) from None

    async def stop(self) -> None:
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        metrics.resource_stopped(self.name)
        await self.source.close()

    async def _take(self, devices: tuple[Device, ...]) -> None:
        """The source's new list (its sink, sources/base.py). Held before the first await, so
        each view shown is of the newest list, whatever order two calls finish in."""
        old, self._devices = self._devices, devices
        changed = revision.changes(devices, old)
        if changed is not None and all(devices[i].id == old[i].id for i in changed):
            # A revision of the list held (shim/revision.py): only the changed devices are new.
            for i in changed:
                self._by_id[devices[i].id] = devices[i]
            self._healthy += sum(devices[i].health is Health.HEALTHY for i in changed)
            self._healthy -= sum(old[i].health is Health.HEALTHY for i in changed)
        else:
            # map and zip run in C: still, 50,000 devices cost 15 ms, so not on every change.
            self._by_id = dict(zip(map(_ID, devices), devices, strict=True))
            self._healthy = list(map(_HEALTH, devices)).count(Health.HEALTHY)
        metrics.devices(self.name, self._healthy, len(devices) - self._healthy)
        logger.debug("{}: {} devices, {} healthy", self.name, len(devices), self._healthy)
        self._first_list.set()
        await self._show()

    async def _show(self) -> None:
        """Each API's view of the devices, the holds of the other applied (core/holds.py)."""
        if self.holds is None:
            await self._latest.publish(self._devices)
            return
        await self._latest.publish(self.holds.for_plugin(self._devices))
        self._dra_devices = self.holds.for_dra(self._devices)
        await self._dra_latest.publish(self._dra_devices)

    async def serve_dra(
        self, claims: dict[str, str], listed: Iterable[str], shares: dict[str, set[str]] | None = None
    ) -> None:
        """This resource is in a DRA driver's pool as well: from now on a device is held by one
        API at a time. ``claims``: device ID -> the claim holding it (the DRA checkpoint's), and
        ``shares`` the claims holding shares of it; ``listed``: the devices PodResources last
        listed as held by containers."""
        if self.holds is None:
            self.holds = Holds(self.name, lambda: self._by_id)
        self.holds.claims_restored(claims, shares)
        self.holds.plugin_listed(listed)
        await self._show()

    async def plugin_listed(self, device_ids: Iterable[str]) -> None:
        """The devices the kubelet's PodResources lists as held by containers now."""
        if self.holds is not None and self.holds.plugin_listed(device_ids):
            await self._show()

    # --- what the front end asks -----------------------------------------

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    def capabilities(self) -> Capabilities:
        return self.source.capabilities()

    async def watch(self) -> AsyncGenerator[tuple[Device, ...], None]:
        """The full list now, then a full list on every change; changes made while
        a slow reader was busy are coalesced into the newest list. A device a DRA claim holds
        is Unhealthy in it."""
        async for devices in self._latest.follow():
            yield devices

    @property
    def dra_devices(self) -> tuple[Device, ...]:
        """The devices DRA publishes: none a container holds through the device plugin."""
        return self._dra_devices if self.holds is not None else self._devices

    async def watch_dra(self) -> AsyncGenerator[tuple[Device, ...], None]:
        """``dra_devices`` now and on every change (after ``serve_dra``)."""
        async for devices in self._dra_latest.follow():
            yield devices

    async def allocate(self, requests: Sequence[ContainerAllocateRequest]) -> list[ContainerGrant]:
        for request in requests:
            if self.holds is not None:
                self.holds.check_for_plugin(request.device_ids)
            self._check_usable(request.device_ids)
        if self.holds is None:
            return await self._allocate(requests)
        # Held from now, before the driver answers: a claim racing for a device finds it taken.
        if any([self.holds.plugin_allocated(r.device_ids) for r in requests]):
            await self._show()
        try:
            return await self._allocate(requests)
        except BaseException:
            if any([self.holds.plugin_freed(r.device_ids) for r in requests]):
                await self._show()
            raise

    async def _allocate(self, requests: Sequence[ContainerAllocateRequest]) -> list[ContainerGrant]:
        # One grant per request, in order: the source's contract (sources/base.py), held where a
        # driver's answer crosses the pipe (driverhost/protocol.py); the kubelet pairs by position.
        grants = list(await self.source.allocate(requests))
        for grant in grants:
            try:
                self.policy.check(grant)
            except GrantRefused as refused:
                self._refused(refused, requests)
                raise
        if self._on_allocated is not None:
            for request in requests:
                self._on_allocated(self.name, list(request.device_ids))
        return grants

    async def prepare(
        self,
        device_ids: Sequence[str],
        claim: str = "a claim",
        *,
        admin_access: bool = False,
        shares: tuple[DeviceShare, ...] = (),
    ) -> ContainerGrant:
        """DRA's preparation of ``claim``'s devices of this resource (docs/dra.md, "From the
        device plugin to a claim"): the guard and the grant policy of Allocate, then the driver's
        pre-start; not tracked for the v1beta1 Deallocate emulation, since the kubelet says
        itself when a claim is done (``unprepare``). The devices are the claim's from the start
        (core/holds.py), and again free if it fails. An admin-access claim takes nothing: its
        devices may be anyone's and stay so (no hold, no pre-start; docs/dra.md, "Admin access").
        A share of a device that allows multiple allocations holds it beside the other shares,
        without a pre-start (docs/dra.md, "Consumable capacity")."""
        if admin_access:
            self._check_known(device_ids)  # Unhealthy or held by another: an admin may still look
            return await self._unheld(ContainerAllocateRequest(tuple(device_ids), True, shares))
        if shares:
            return await self._prepare_shares(device_ids, claim, shares)
        self._check_usable(device_ids)
        if self.holds is None:
            return await self._prepare(device_ids)
        self.holds.check_for_claim(device_ids, claim)
        if self.holds.claim_prepared(device_ids, claim):
            await self._show()
        try:
            return await self._prepare(device_ids)
        except BaseException:
            await self.claim_gone(device_ids, claim)
            raise

    async def _prepare(self, device_ids: Sequence[str]) -> ContainerGrant:
        request = ContainerAllocateRequest(tuple(device_ids))
        (grant,) = await self.source.allocate([request])
        try:
            self.policy.check(grant)
        except GrantRefused as refused:
            self._refused(refused, [request])
            raise
        await self.prestart(device_ids)
        return grant

    async def _prepare_shares(
        self, device_ids: Sequence[str], claim: str, shares: tuple[DeviceShare, ...]
    ) -> ContainerGrant:
        self._check_usable(device_ids)
        if self.holds is not None:
            self.holds.check_for_claim(device_ids, claim, shared=True)
            if self.holds.claim_prepared(device_ids, claim, shared=True):
                await self._show()
        try:
            return await self._unheld(ContainerAllocateRequest(tuple(device_ids), shares=shares))
        except BaseException:
            await self.claim_gone(device_ids, claim)
            raise

    async def _unheld(self, request: ContainerAllocateRequest) -> ContainerGrant:
        """The driver's grant for a request that takes no device for itself (admin access, a
        share): held to the policy, no pre-start, and nothing to deallocate if refused."""
        (grant,) = await self.source.allocate([request])
        try:
            self.policy.check(grant)
        except GrantRefused as refused:
            metrics.policy_refused(self.name, refused.kind)
            raise
        return grant

    async def unprepare(
        self,
        device_ids: Sequence[str],
        claim: str,
        *,
        admin_access: bool = False,
        shares: tuple[DeviceShare, ...] = (),
    ) -> None:
        """A prepared claim's devices are free again: the driver's deallocate; errors raise
        (the kubelet retries unprepare, and the claim holds its devices until it succeeds). An
        admin-access claim took nothing, so nothing is given back; a share is dropped from its
        device's holds, and the driver is not asked (the device stays with its other shares)."""
        if admin_access:
            return
        if not shares:
            await self.source.deallocate(device_ids)
        await self.claim_gone(device_ids, claim)

    async def claim_gone(self, device_ids: Sequence[str], claim: str) -> None:
        """``claim`` holds these devices no more, whatever the driver said (a device another
        claim holds stays held)."""
        if self.holds is not None and self.holds.claim_freed(device_ids, claim):
            await self._show()

    def _refused(self, refused: GrantRefused, requests: Sequence[ContainerAllocateRequest]) -> None:
        metrics.policy_refused(self.name, refused.kind)
        logger.warning(
            "{}: {} granted {} {} outside the policy ({}); Allocate refused",
            self.name, self._granter, refused.field, refused.shown, refused.rule,
        )  # fmt: skip
        # The kubelet frees the devices of a failed Allocate (devicemanager manager.go restores
        # allocatedDevices from podDevices): a driver that tracks allocations hears so.
        for request in requests:
            task = asyncio.create_task(self.deallocate(request.device_ids), name=f"refused:{self.name}")
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def deallocate_now(self, device_ids: Sequence[str]) -> None:
        """The kubelet says these devices are free (v1beta2 Deallocate); errors reach it."""
        self._check_known(device_ids)
        if self._on_released is not None:
            # Said by the kubelet itself: the PodResources emulation must not say it again.
            self._on_released(self.name, list(device_ids))
        await self._plugin_freed(device_ids)
        await self.source.deallocate(device_ids)

    async def _plugin_freed(self, device_ids: Sequence[str]) -> None:
        if self.holds is not None and self.holds.plugin_freed(device_ids):
            await self._show()

    async def post_stop(self, device_ids: Sequence[str]) -> None:
        """A container using these devices stopped (v1beta2 PostStopContainer)."""
        self._check_known(device_ids)
        await self.source.post_stop(device_ids)

    def _check_known(self, device_ids: Sequence[str]) -> None:
        for device_id in device_ids:
            if device_id not in self._by_id:
                raise UnknownDevice(self.name, device_id)

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        """Tell the source a device group is free again; never raises (background work)."""
        await self._plugin_freed(device_ids)
        try:
            await self.source.deallocate(device_ids)
        except Exception as exc:
            logger.warning("{}: deallocate of {} failed: {}", self.name, ", ".join(device_ids), exc)

    async def preferred_allocation(self, request: PreferredAllocationRequest) -> tuple[str, ...]:
        """Exactly ``request.size`` IDs, every must-include ID among them (the contract
        stated on PreferredAllocationRequest in upstream's api.proto).

        The source's preference is taken where it is valid and the rest is
        filled in order, so a sloppy source can never break the kubelet's rule.
        """
        candidates = list(dict.fromkeys([*request.must_include, *request.available]))
        if request.size < len(request.must_include):
            raise RequestError(
                f"{self.name}: allocation_size {request.size} is smaller than the "
                f"{len(request.must_include)} must-include devices"
            )
        if request.size > len(candidates):
            raise RequestError(
                f"{self.name}: allocation_size {request.size} exceeds the {len(candidates)} available devices"
            )
        if not self._by_id.keys() >= set(candidates):  # in C; then find the first, to name it
            raise UnknownDevice(self.name, next(i for i in candidates if i not in self._by_id))
        preferred: Sequence[str] = ()
        if self.capabilities().preferred_allocation:
            preferred = await self.source.preferred_allocation(request)
        allowed = set(candidates)
        chosen = dict.fromkeys(request.must_include)
        for device_id in [*preferred, *candidates]:
            if len(chosen) >= request.size:
                break
            if device_id in allowed:
                chosen.setdefault(device_id)
        return tuple(chosen)

    async def prestart(self, device_ids: Sequence[str]) -> None:
        for device_id in device_ids:
            if device_id not in self._by_id:
                raise UnknownDevice(self.name, device_id)
        if not self.capabilities().pre_start:
            return
        try:
            # Answer inside the kubelet's PreStartContainer deadline (shim/model.py), with our reason.
            async with asyncio.timeout(self._prestart_timeout_s):
                await self.source.prestart(device_ids)
        except TimeoutError:
            raise SourceTimeout(
                f"{self.name}: pre-start of {', '.join(device_ids)} "
                f"took longer than {self._prestart_timeout_s}s"
            ) from None

    async def attach(self, device_id: str, claim: str, claim_uid: str) -> tuple[BindingCondition, ...]:
        """DRA binding conditions: the driver attaches a device the scheduler allocated to
        ``claim`` and says how the device's conditions stand (shim/dra/binding.py writes them)."""
        device = self._by_id.get(device_id)
        if device is None:
            raise UnknownDevice(self.name, device_id)
        if device.binding is None or not self.capabilities().attach:
            raise SourceFailed(f"{self.name}: {device_id!r} has no binding conditions its driver attaches")
        return await self.source.attach(device_id, claim, claim_uid, device.binding)

    async def detach(self, device_id: str, claim: str, claim_uid: str) -> None:
        """Undo ``attach``: ``claim``'s allocation of the device is gone (the device may be too)."""
        if self.capabilities().attach:
            await self.source.detach(device_id, claim, claim_uid)

    def _check_usable(self, device_ids: Sequence[str]) -> None:
        for device_id in device_ids:
            device = self._by_id.get(device_id)
            if device is None:
                raise UnknownDevice(self.name, device_id)
            if (
                device.health is not Health.HEALTHY
                and self.source.recovering_health(device_id) is not Health.HEALTHY
            ):
                raise UnhealthyDevice(self.name, device_id)

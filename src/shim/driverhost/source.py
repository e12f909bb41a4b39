"""One resource of a driver, as a device source for the core.

It remembers the driver's real device list through outages: while the driver
is down every device is listed as Unhealthy (never dropped), and a device that
was Healthy before may still be allocated, waiting for the driver to return.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import operator
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from itertools import compress
from typing import Any

from loguru import logger

from shim import grants, revision
from shim.driverhost import protocol
from shim.errors import RequestError, ShimError, SourceUnavailable
from shim.groups import DeviceGroups, Group
from shim.inventory import InventoryStore, SavedResource
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
from shim.sources.base import DeviceSource

_DEVICE, _GRANT, _ID = operator.itemgetter(0), operator.itemgetter(1), operator.attrgetter("id")
Call = Callable[[str, Any, Callable[[Any], Any]], Awaitable[Any]]  # method, params, parse
SAVE_DELAY_S = 0.2  # coalesce bursts of changes into one write


def _ignored(result: Any) -> None:
    """The answer of a call that only acknowledges: whatever it holds."""


class DriverSource(DeviceSource):
    def __init__(
        self,
        info: protocol.ResourceInfo,
        call: Call,
        store: InventoryStore | None = None,
        up_wait_s: float = 0.0,
    ) -> None:
        """``up_wait_s``: how long a call that needs the driver's word (deallocate) waits for a
        driver that is not running yet, or restarting (``restart.call_wait_s``)."""
        self.info = info
        self._up = asyncio.Event()  # set while the driver serves this resource (not down)
        self._up_wait_s = up_wait_s
        self._call = call
        self._store = store
        self._real: tuple[Device, ...] = ()
        # The list last taken as the driver sent it, while ``_real`` is that list's devices: a
        # revision of it is taken at its changes alone (take_devices).
        self._taken: Sequence[tuple[Device, ContainerGrant | None]] = ()
        self._index: dict[str, int] = {}  # device id -> position in _real
        self._declared: dict[str, ContainerGrant] = {}
        # Each hands out one object per grant, so the policy's verdict and the front end's
        # encoding, kept by object identity, are reused: ByDevices per device-ID tuple for the
        # declared grants (replaced with them), Equal per distinct value for per-call answers.
        self._merged = grants.ByDevices(self._merge_declared)
        self._equal = grants.Equal()
        self._down = False
        self._in_use: DeviceGroups[None] = DeviceGroups()
        self._saving: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def _down(self) -> bool:
        """The driver does not serve this resource now: not started yet, or restarting."""
        return not self._up.is_set()

    @_down.setter
    def _down(self, down: bool) -> None:
        if down:
            self._up.clear()
        else:
            self._up.set()

    @property
    def in_use(self) -> tuple[Group, ...]:
        """The device groups allocated and not known to be free, oldest first."""
        return tuple(self._in_use)

    def capabilities(self) -> Capabilities:
        return self.info.capabilities

    def recovering_health(self, device_id: str) -> Health | None:
        if not self._down:
            return None
        i = self._index.get(device_id)
        return None if i is None else self._real[i].health

    # --- state from the driver, or from the last run -----------------------

    async def restore(self, saved: SavedResource) -> None:
        """Devices known from before devshim started; Unhealthy until the driver lists them."""
        self._real, self._in_use, self._down = saved.devices, DeviceGroups(saved.in_use), True
        self._taken = ()
        self._index = {d.id: i for i, d in enumerate(self._real)}
        await self._publish()

    async def refresh(self) -> None:
        await self.set_devices(await self._listed())

    async def ask(self) -> tuple[Device, ...]:
        """What the driver lists now, asked directly and not published (refresh publishes):
        to compare with what it notified."""
        return tuple(device for device, _ in await self._listed())

    async def _listed(self) -> list[tuple[Device, ContainerGrant | None]]:
        listed: list[tuple[Device, ContainerGrant | None]] = await self._call(
            "list_devices", protocol.list_devices_params(self.name), self.devices_from_json
        )
        return listed

    async def set_devices(self, devices: Sequence[tuple[Device, ContainerGrant | None]]) -> None:
        self.take_devices(devices)
        await self._publish()

    def take_devices(self, devices: Sequence[tuple[Device, ContainerGrant | None]]) -> None:
        """Hold ``devices`` as the driver's list now (``publish`` tells the followers). Not async:
        the driver host counts what its sources hold before it takes a list (driverhost/limits.py),
        so a list must be held from the moment it is counted in, with nothing run in between.

        A long list re-sent with one change is the last list's revision (jsonrpc/sliced.py,
        shim/revision.py): only the changed devices are taken, and the list held is handed on
        as a revision in turn, so the followers redo only those too. Any other list runs in C,
        never a Python step per device, since it runs on the event loop."""
        changed = revision.changes(devices, self._taken)
        if changed is not None and self._take_revision(devices, changed):
            self._taken, self._down = devices, False
            return
        listed = tuple(map(_DEVICE, devices))
        if not self._same_places(listed):
            self._index = dict(zip(map(_ID, listed), itertools.count()))
        self._real = listed
        grants_ = tuple(map(_GRANT, devices))
        present = map(operator.is_not, grants_, itertools.repeat(None))
        declared = dict(compress(zip(map(_ID, listed), grants_, strict=True), present))
        if declared != self._declared:  # the merges kept are stale
            self._declared, self._merged = declared, grants.ByDevices(self._merge_declared)
        self._taken, self._down = devices, False

    def _take_revision(
        self, devices: Sequence[tuple[Device, ContainerGrant | None]], changed: tuple[int, ...]
    ) -> bool:
        """Take the devices at ``changed`` alone, where each keeps its ID (False: it does not)."""
        held = self._real
        if not all(devices[i][0].id == held[i].id for i in changed):
            return False
        real = list(held)
        for i in changed:
            real[i] = devices[i][0]
        self._real = revision.revised(real, held, changed)
        grants_ = {devices[i][0].id: devices[i][1] for i in changed}
        if any(self._declared.get(device_id) != grant for device_id, grant in grants_.items()):
            declared = dict(self._declared)
            for device_id, grant in grants_.items():
                if grant is None:
                    declared.pop(device_id, None)
                else:
                    declared[device_id] = grant
            self._declared, self._merged = declared, grants.ByDevices(self._merge_declared)
        return True

    def devices_from_json(self, result: Any) -> list[tuple[Device, ContainerGrant | None]]:
        """protocol.devices_from_json, for a list this resource is to take."""
        return protocol.devices_from_json(result, self._taken)

    def _same_places(self, listed: tuple[Device, ...]) -> bool:
        """Whether ``listed`` holds the IDs of the list held now, each where it was."""
        held = self._real
        if len(held) != len(listed):
            return False
        moved = compress(range(len(listed)), map(operator.is_not, held, listed))
        return all(held[i].id == listed[i].id for i in moved)

    async def set_health(self, changes: dict[str, Health]) -> None:
        self.take_health(changes)
        await self._publish()

    def take_health(self, changes: dict[str, Health]) -> None:
        """Apply health changes to the held list (``publish`` tells the followers); not async, so
        that changes and lists apply in the order the driver sent them."""
        unknown = [i for i in changes if i not in self._index]
        if unknown:
            logger.warning("{}: health_changed names unknown devices {}", self.name, sorted(unknown))
        # Only the changed devices are new objects, handed on as a revision: the followers redo
        # only those, and a change among 50,000 devices costs a list copy, not a pass over all.
        held, real, changed = self._real, list(self._real), []
        for device_id, health in changes.items():
            i = self._index.get(device_id)
            if i is not None and real[i].health != health:
                real[i] = replace(real[i], health=health)
                changed.append(i)
        if changed:  # the devices held are no longer those of the list taken
            self._real, self._taken = revision.revised(real, held, changed), ()

    @property
    def device_count(self) -> int:
        """How many devices this resource holds (Unhealthy ones through an outage included)."""
        return len(self._real)

    async def outage(self) -> None:
        """The driver is gone: every device stays listed, as Unhealthy."""
        self._down = True
        await self._publish()

    async def publish(self) -> None:
        """Tell the followers the list held now."""
        await self._publish()

    async def _publish(self) -> None:
        # The outage overlay, its one place: while the driver is down every device it listed is
        # shown Unhealthy, never dropped (a dropped device is removed from the node).
        shown = tuple(replace(d, health=Health.UNHEALTHY) for d in self._real) if self._down else self._real
        self._shown = shown
        if self._sink is not None:
            await self._sink(shown)
        self._save_soon()

    def _save_soon(self) -> None:
        if self._store is not None and (self._saving is None or self._saving.done()):
            self._saving = asyncio.create_task(self._save())

    async def _save(self) -> None:
        await asyncio.sleep(SAVE_DELAY_S)
        assert self._store is not None
        snapshot, stamp = SavedResource(self._real, self.in_use, self.info.capabilities), self._store.stamp()
        await self._store.save_in_slices(self.name, snapshot, stamp)

    async def close(self) -> None:
        if self._saving is not None and not self._saving.done():
            # A save already on its thread cannot be stopped: the store drops it if it ends later.
            self._saving.cancel()
            if self._store is not None:
                self._store.save(self.name, SavedResource(self._real, self.in_use, self.info.capabilities))

    # --- calls from the core ---------------------------------------------

    async def allocate(self, requests: Sequence[ContainerAllocateRequest]) -> list[ContainerGrant]:
        declared = self._declared
        if all(i in declared for r in requests for i in r.device_ids):
            # Every device declared its grant at list time: no round trip, even mid-restart.
            answer = [self._merged.get(r.device_ids) for r in requests]
        else:
            if any(r.admin_access for r in requests) and not self.info.capabilities.admin_access:
                raise RequestError(
                    f"{self.name}: an admin-access claim needs the driver to declare admin_access for "
                    "the resource (driver protocol 1.3), or a declared grant for each device"
                )
            if any(r.shares for r in requests) and not self.info.capabilities.shares:
                raise RequestError(
                    f"{self.name}: a shared allocation needs the driver to declare shares for the "
                    "resource (driver protocol 1.3), or a declared grant for each device"
                )
            count = len(requests)
            params = protocol.allocate_params(self.name, requests)
            granted = await self._call("allocate", params, lambda r: protocol.grants_from_json(r, count))
            answer = list(map(self._equal, granted))
        self._mark_in_use(requests)
        return answer

    def _merge_declared(self, device_ids: tuple[str, ...]) -> ContainerGrant:
        return grants.merge(self._declared[i] for i in device_ids)

    def _mark_in_use(self, requests: Sequence[ContainerAllocateRequest]) -> None:
        # An admin-access request takes nothing, nor does a share: the devices stay with the others.
        changed = [self._in_use.add(r.device_ids) for r in requests if not (r.admin_access or r.shares)]
        if any(changed):  # the same devices again (an init container's, say) change nothing saved
            self._save_soon()

    async def preferred_allocation(self, request: PreferredAllocationRequest) -> Sequence[str]:
        try:
            params = protocol.preferred_params(self.name, request)
            parse = protocol.preference_from_json
            preferred: Sequence[str] = await self._call("preferred_allocation", params, parse)
            return preferred
        except ShimError as exc:
            # Optional advice: without it the kubelet (and the core) choose themselves,
            # which beats failing pod admission because one driver is slow or down.
            logger.warning("{}; choosing without the driver's preference", exc)
            return ()

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        if self._down:
            # Not running, or not yet since devshim started: even whether it wants deallocate
            # is unknown (its capabilities come with initialize). Skipping would lose the call,
            # so it waits a while for the driver (right after devshim starts, it is starting).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._up_wait_s):
                    await self._up.wait()
        if self._down:
            raise SourceUnavailable(f"{self.name}: the driver is not running; deallocate once it is back")
        if self.info.capabilities.deallocate:
            await self._call("deallocate", protocol.devices_params(self.name, device_ids), _ignored)
        # Free: a restarted driver is no longer told they are allocated (initialize).
        group = tuple(device_ids)
        if group in self._in_use:
            self._in_use.drop(group)
            self._save_soon()

    async def post_stop(self, device_ids: Sequence[str]) -> None:
        if self.info.capabilities.post_stop:
            await self._call("post_stop", protocol.devices_params(self.name, device_ids), _ignored)

    async def attach(
        self, device_id: str, claim: str, claim_uid: str, binding: DeviceBinding
    ) -> tuple[BindingCondition, ...]:
        params = protocol.attach_params(self.name, device_id, claim, claim_uid)
        parse = functools.partial(protocol.conditions_from_result, device_id=device_id, binding=binding)
        conditions: tuple[BindingCondition, ...] = await self._call("attach", params, parse)
        return conditions

    async def detach(self, device_id: str, claim: str, claim_uid: str) -> None:
        params = protocol.attach_params(self.name, device_id, claim, claim_uid)
        # A driver whose attach leaves nothing to undo need not implement it.
        with contextlib.suppress(protocol.CapabilityAbsent):
            await self._call("detach", params, _ignored)

    async def prestart(self, device_ids: Sequence[str]) -> None:
        try:
            await self._call("prestart", protocol.devices_params(self.name, device_ids), _ignored)
        except protocol.CapabilityAbsent as exc:
            # Declared but not implemented: nothing to prepare, so the container may start.
            logger.warning("{}; treating pre-start as not needed", exc)

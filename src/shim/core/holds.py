"""Which API holds a device of a resource served through both the device plugin API and DRA
(docs/dra.md, "Both APIs at once").

The kubelet's device manager picks device-plugin devices and the scheduler picks DRA devices,
neither knowing of the other, so devshim cannot arbitrate before they decide; it withdraws. A
device prepared for a claim is Unhealthy to the device plugin (the kubelet allocates only healthy
devices); a device allocated to a container through the device plugin leaves the published pool
(the scheduler allocates only published devices). Where both reach one device before the
withdrawal is seen, the later request fails naming the holder.

A device-plugin hold lasts until the kubelet frees the devices: v1beta2's Deallocate, or the
v1beta1 Deallocate emulation (deviceplugin/deallocation.py) seeing no container hold them. The
devices the kubelet's PodResources lists as held by containers are held too, so a restarted
devshim, which has no record of the Allocates before, withdraws them all the same.

Devices that share counters (a GPU and its partitions: core/counters.py) are held by what they
consume as well: a device whose consumption does not fit what the other holds leave is Unhealthy
to the device plugin, DRA publishes each set less what containers' devices consume, and a request
either API makes that does not fit is refused naming the counter set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction

from shim.core import counters
from shim.errors import DeviceHeld
from shim.groups import DeviceGroups
from shim.model import Device, Health

PLUGIN = "the device plugin API"


class Holds:
    """One resource's holds by API. Each change answers whether the views changed."""

    def __init__(self, resource: str, devices: Callable[[], Mapping[str, Device]] = dict) -> None:
        """``devices``: the resource's devices by ID now, for their counters."""
        self.resource = resource
        self._devices = devices
        self._claims: dict[str, str] = {}  # device ID -> the claim that holds it through DRA
        # Device ID -> the claims holding a share of it (a device that allows multiple allocations).
        self._shares: dict[str, set[str]] = {}
        self._plugin: DeviceGroups[float] = DeviceGroups()  # allocated to containers, and when
        self._listed: frozenset[str] = frozenset()  # held by containers, as PodResources lists
        self._counted: tuple[tuple[Device, ...] | None, bool] = (None, False)
        self._copies: dict[str, tuple[Device, Device]] = {}  # id -> (device, its Unhealthy copy)

    # --- the device plugin's side -----------------------------------------

    def check_for_plugin(self, device_ids: Iterable[str]) -> None:
        for device_id in device_ids:
            claim = self._claims.get(device_id)
            if claim is not None:
                raise DeviceHeld(self.resource, device_id, f"{claim} through DRA", PLUGIN)
            if sharing := self._shares.get(device_id):
                raise DeviceHeld(self.resource, device_id, f"{_shares(sharing)} through DRA", PLUGIN)
        self._check_counters(device_ids, self._dra_held() | self._plugin_held(), PLUGIN)

    def _check_counters(self, device_ids: Iterable[str], held: Iterable[str], wanted_by: str) -> None:
        devices = self._devices()
        wanted = [devices[i] for i in device_ids if i in devices]
        if not any(d.consumes_counters for d in wanted):  # most requests: nothing to count
            return
        left = counters.left_after(devices, set(held) - {d.id for d in wanted})
        for device in wanted:
            if (short := counters.short(device, left)) is not None:
                holders = f"DRA claims and containers, which consume counter set {short}"
                raise DeviceHeld(self.resource, device.id, holders, wanted_by)
            counters.take(left, device)

    def _dra_held(self) -> set[str]:
        return self._claims.keys() | self._shares.keys()

    def _plugin_held(self) -> set[str]:
        return {i for group in self._plugin for i in group} | self._listed

    def plugin_allocated(self, device_ids: Sequence[str]) -> bool:
        """A container got these devices: the kubelet holds them through the device plugin (an
        older group sharing a device is superseded, as the kubelet reassigns devices)."""
        return self._plugin.add(tuple(device_ids), time.time())

    def plugin_freed(self, device_ids: Iterable[str]) -> bool:
        before = len(self._plugin)
        self._plugin.drop_sharing(device_ids)
        return len(self._plugin) != before

    def plugin_listed(self, device_ids: Iterable[str]) -> bool:
        """What the kubelet's PodResources lists as held by containers now."""
        listed, self._listed = self._listed, frozenset(device_ids)
        return listed != self._listed

    # --- DRA's side --------------------------------------------------------

    def check_for_claim(self, device_ids: Iterable[str], claim: str, *, shared: bool = False) -> None:
        """``shared``: the claim asks for a share of each device, which other shares leave it."""
        for device_id in device_ids:
            group = self._plugin.holding(device_id)
            if group is not None:
                since = time.strftime("%H:%M:%S", time.gmtime(self._plugin[group] or 0))
                raise DeviceHeld(
                    self.resource, device_id, f"a container through {PLUGIN} (allocated {since} UTC)", claim
                )
            if device_id in self._listed:
                raise DeviceHeld(
                    self.resource, device_id, f"a container through {PLUGIN} (listed by PodResources)", claim
                )
            other = self._claims.get(device_id)
            if other is not None and other != claim:
                raise DeviceHeld(self.resource, device_id, f"{other} through DRA", claim)
            sharing = self._shares.get(device_id, set()) - {claim}
            if sharing and not shared:
                raise DeviceHeld(self.resource, device_id, f"{_shares(sharing)} through DRA", claim)
        # Other claims too: the scheduler counted them already, so only an allocation made from a
        # stale view (or a driver's changed counters) is refused here, never a right one.
        self._check_counters(device_ids, self._dra_held() | self._plugin_held(), claim)

    def claim_prepared(self, device_ids: Iterable[str], claim: str, *, shared: bool = False) -> bool:
        if shared:
            added = [i for i in device_ids if claim not in self._shares.setdefault(i, set())]
            for device_id in added:
                self._shares[device_id].add(claim)
            return bool(added)
        before = dict(self._claims)
        self._claims.update(dict.fromkeys(device_ids, claim))
        return self._claims != before

    def claims_restored(self, claims: dict[str, str], shares: dict[str, set[str]] | None = None) -> None:
        """Device ID -> the claim holding it, and the claims holding shares of it, as a checkpoint
        kept them."""
        self._claims.update(claims)
        for device_id, sharing in (shares or {}).items():
            self._shares.setdefault(device_id, set()).update(sharing)

    def claim_freed(self, device_ids: Iterable[str], claim: str) -> bool:
        """``claim`` gives these devices (or its shares of them) back; one another claim holds
        stays held."""
        freed = False
        for device_id in device_ids:
            if self._claims.get(device_id) == claim:
                del self._claims[device_id]
                freed = True
            sharing = self._shares.get(device_id)
            if sharing is not None and claim in sharing:
                sharing.discard(claim)
                freed = True
                if not sharing:
                    del self._shares[device_id]
        return freed

    # --- what each API is shown ----------------------------------------------

    def for_plugin(self, devices: tuple[Device, ...]) -> tuple[Device, ...]:
        """The devices as the device plugin lists them: a claim's devices Unhealthy, and a device
        whose counters the held devices have taken."""
        if not self._claims and not self._shares and not self._counting(devices):
            return devices
        claims, shares = self._claims, self._shares
        if len(self._copies) > 2 * len(devices) + 64:  # a driver renaming its devices: not kept forever
            self._copies.clear()
        taken: set[str] = set()
        if self._counting(devices):
            held = self._dra_held() | self._plugin_held()
            left = counters.left_after(self._devices(), held)
            taken = {d.id for d in devices if d.id not in held and counters.short(d, left) is not None}
        return tuple(
            self._unhealthy(d)
            if (d.id in claims or d.id in shares or d.id in taken) and d.health is Health.HEALTHY
            else d
            for d in devices
        )

    def _unhealthy(self, device: Device) -> Device:
        """``device`` Unhealthy, the same copy while the device is the same object: every show of a
        flood of claims made 64 copies (bench/dra_flood.py's profile)."""
        kept = self._copies.get(device.id)
        if kept is None or kept[0] is not device:
            kept = self._copies[device.id] = (device, replace(device, health=Health.UNHEALTHY))
        return kept[1]

    def for_dra(self, devices: tuple[Device, ...]) -> tuple[Device, ...]:
        """The devices DRA publishes: none a container holds through the device plugin, and each
        counter set less what containers' devices consume."""
        if not len(self._plugin) and not self._listed:
            return devices
        held, listed = self._plugin.holding, self._listed
        kept = tuple(d for d in devices if held(d.id) is None and d.id not in listed)
        if not self._counting(devices):
            return kept
        used: counters.Left = {}  # what containers' devices consume, by set
        by_id = self._devices()
        for device_id in self._plugin_held():
            for use in by_id[device_id].consumes_counters if device_id in by_id else ():
                for name, amount in counters.consumption(use):
                    counted = used.setdefault(use.name, {})
                    counted[name] = counted.get(name, Fraction(0)) + amount
        return counters.reduced(kept, used)

    def _counting(self, devices: tuple[Device, ...]) -> bool:
        """Whether any device consumes counters; asked once per list (it is held by identity)."""
        if self._counted[0] is not devices:
            self._counted = (devices, any(d.consumes_counters for d in devices))
        return self._counted[1]

    def status(self) -> dict[str, list[str]]:
        return {
            "dra": sorted(self._claims.keys() | self._shares.keys()),
            "device_plugin": sorted({i for group in self._plugin for i in group} | self._listed),
        }


def _shares(claims: set[str]) -> str:
    """The holders of a shared device, for an error."""
    named = sorted(claims)
    return f"shares of {named[0]}" + (f" and {len(named) - 1} more" if len(named) > 1 else "")

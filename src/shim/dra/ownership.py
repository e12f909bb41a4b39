"""Which resource owns each DRA device name of one pool: the one answer the publisher (what the
scheduler sees), the preparer (whose driver prepares a claim's device) and the health stream use.

A DRA driver's pool is made of the resources its ``dra.drivers[].resources`` lists, each served
by its own driver. Two of them may list one device ID, or IDs that meet in one DRA device name
(names.py): publishing one name for both would let the scheduler allocate one driver's device
and the other prepare it. The rule, a pure function of the configuration and the device lists:

- the resource listed first in ``dra.drivers[].resources`` keeps the name; within one resource
  the ID that sorts first does. The operator's order, not who listed the ID first: after a
  restart the drivers start in any order, and a hostile driver that starts faster must not take
  over an honest driver's device;
- the other devices meeting in that name are refused (not published, not prepared, no health
  reported); the rest of the pool is published as usual, and the clash is an error in the log and
  in /status for as long as it lasts.

A resource keeps its claim while it is not served (at start before its driver host restores it,
or while a reload has taken its driver out; a driver that restarts keeps its resource served, its
devices Unhealthy): its last-known devices count as its list, so a hostile driver that starts
faster, or lists while the owner's driver is away, cannot take a name in that gap. They are the
last list it was seen serving, or, when devshim has not seen it served since it started, its
driver's inventory (shim/inventory.py: what the driver host restores at start). A held name is
owned but neither published, prepared nor reported on by anyone: its owner is not served, and no
other resource may have it. The names are released only when the owner itself serves a list
without them (a resource its own driver stops declaring stays held until devshim restarts, its
inventory forgotten). On a first start with no inventory (or one that cannot be read) there is
nothing to hold: until the resource is served, a later resource listing its IDs keeps them, and
loses them to it once it lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from shim.dra.names import device_name
from shim.dra.slices import PoolDevice
from shim.model import Device

CLASHES_SAID = 3  # a hostile list may clash on every device: the message names this many


@dataclass(frozen=True, slots=True)
class Clash:
    """A device refused: its DRA device name is another's (``owner``: resource, device ID)."""

    name: str
    resource: str
    device_id: str
    owner: tuple[str, str]
    held: bool = False  # the owner is not served: its last-known devices hold the name

    def __str__(self) -> str:
        resource, device_id = self.owner
        return (
            f"device {self.device_id!r} of {self.resource} is refused: its DRA device name {self.name!r} "
            f"is {resource}'s device {device_id!r}"
            + (f" (held while {resource} is not served)" if self.held else "")
        )


@dataclass(frozen=True, slots=True)
class Ownership:
    """One pool's owners: ``names`` maps each DRA device name to (resource, device ID);
    ``ids`` maps each resource's owned device IDs to their names. Both hold the names a resource
    not served keeps: with no list of it served, no one publishes, prepares or reports them."""

    names: Mapping[str, tuple[str, str]]
    ids: Mapping[str, Mapping[str, str]]
    clashes: tuple[Clash, ...] = ()

    def problem(self) -> str | None:
        """The clashes, said for the log and /status (None: there are none)."""
        if not self.clashes:
            return None
        said = "; ".join(map(str, self.clashes[:CLASHES_SAID]))
        more = len(self.clashes) - CLASHES_SAID
        return (
            f"device names clash in the pool: {said}"
            + (f"; and {more} more" if more > 0 else "")
            + " (the resource listed first in dra.drivers[].resources keeps a name)"
        )

    def published(self, lists: Mapping[str, Sequence[Device]]) -> list[PoolDevice]:
        """Of each resource's devices in ``lists`` (those DRA may publish now), the ones it owns,
        named."""
        entries: list[PoolDevice] = []
        for resource, devices in lists.items():
            ids = self.ids.get(resource, {})
            entries.extend(PoolDevice(ids[d.id], d, resource) for d in devices if d.id in ids)
        return entries


def decide(listed: Sequence[tuple[str, Sequence[Device]]], held: Collection[str] = ()) -> Ownership:
    """The owners of a pool whose resources list ``listed``, in the configured order; the lists
    of the resources in ``held`` are their last-known devices (they are not served), which own
    names just as served lists do."""
    kept: dict[str, tuple[int, str, str]] = {}  # name -> (position, resource, device ID)
    refused: list[tuple[str, str, str]] = []  # (name, resource, device ID)
    for position, (resource, devices) in enumerate(listed):
        for device in devices:
            name = device_name(device.id)
            mine = (position, resource, device.id)
            owner = kept.setdefault(name, mine)
            if owner == mine:
                continue  # a new name, or the same device listed twice
            if (position, device.id) < (owner[0], owner[2]):
                kept[name] = mine
                refused.append((name, owner[1], owner[2]))
            else:
                refused.append((name, resource, device.id))
    names = {name: (resource, device_id) for name, (_, resource, device_id) in kept.items()}
    ids: dict[str, dict[str, str]] = {resource: {} for resource, _ in listed}
    for name, (resource, device_id) in names.items():
        ids[resource][device_id] = name
    clashes = tuple(
        sorted(
            (
                Clash(name, resource, device_id, names[name], names[name][0] in held)
                for name, resource, device_id in refused
            ),
            key=lambda c: (c.name, c.resource, c.device_id),
        )
    )
    return Ownership(names, ids, clashes)


class Served(Protocol):
    """A served resource, as far as ownership goes (core/resource.py's ResourceService)."""

    @property
    def devices(self) -> Sequence[Device]: ...


def nothing_known(resource: str) -> Sequence[Device]:
    """No devices known from before devshim started (no inventory to read)."""
    return ()


class PoolOwners:
    """``decide`` over each resource's devices: the ones it serves now, or while it is not served
    the last it was seen serving (until it was seen once, ``last_known``'s: its inventory); done
    again only when a list changed (the lists are held, so compared by identity)."""

    def __init__(
        self,
        resources: Sequence[str],
        services: Callable[[], Mapping[str, Served]],
        last_known: Callable[[str], Sequence[Device]] = nothing_known,
    ) -> None:
        self.resources = tuple(resources)
        self._services = services
        self._last_known = last_known
        self._last: dict[str, Sequence[Device]] = {}  # each resource's list as last seen, or its inventory
        self._decided: tuple[tuple[tuple[Sequence[Device], bool], ...], Ownership] = ((), decide(()))

    def __call__(self) -> Ownership:
        served = self._services()
        for resource in self.resources:
            if resource in served:
                self._last[resource] = served[resource].devices  # a list without a name releases it
            elif resource not in self._last:
                # Read once (bounded; inventory.py), and only for a resource not restored at start.
                self._last[resource] = tuple(self._last_known(resource))
        lists = tuple((self._last[r], r in served) for r in self.resources)
        seen, ownership = self._decided
        if len(seen) != len(lists) or any(
            a is not b or a_served != b_served
            for (a, a_served), (b, b_served) in zip(seen, lists, strict=True)
        ):
            held = {r for r in self.resources if r not in served}
            ownership = decide(tuple((r, self._last[r]) for r in self.resources), held)
            self._decided = (lists, ownership)
        return ownership


@dataclass(frozen=True, slots=True)
class Offer:
    """What a pool publishes now: its owned devices, named, and the clashes said (None: none)."""

    devices: list[PoolDevice]
    problem: str | None = None

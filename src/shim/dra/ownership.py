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

A resource that is not served (its driver is not up yet) lists no devices, so it owns nothing
until it lists them again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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

    def __str__(self) -> str:
        resource, device_id = self.owner
        return (
            f"device {self.device_id!r} of {self.resource} is refused: its DRA device name {self.name!r} "
            f"is {resource}'s device {device_id!r}"
        )


@dataclass(frozen=True, slots=True)
class Ownership:
    """One pool's owners: ``names`` maps each DRA device name to (resource, device ID);
    ``ids`` maps each resource's owned device IDs to their names."""

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
            entries.extend(PoolDevice(ids[d.id], d) for d in devices if d.id in ids)
        return entries


def decide(listed: Sequence[tuple[str, Sequence[Device]]]) -> Ownership:
    """The owners of a pool whose resources list ``listed``, in the configured order."""
    held: dict[str, tuple[int, str, str]] = {}  # name -> (position, resource, device ID)
    refused: list[tuple[str, str, str]] = []  # (name, resource, device ID)
    for position, (resource, devices) in enumerate(listed):
        for device in devices:
            name = device_name(device.id)
            mine = (position, resource, device.id)
            owner = held.setdefault(name, mine)
            if owner == mine:
                continue  # a new name, or the same device listed twice
            if (position, device.id) < (owner[0], owner[2]):
                held[name] = mine
                refused.append((name, owner[1], owner[2]))
            else:
                refused.append((name, resource, device.id))
    names = {name: (resource, device_id) for name, (_, resource, device_id) in held.items()}
    ids: dict[str, dict[str, str]] = {resource: {} for resource, _ in listed}
    for name, (resource, device_id) in names.items():
        ids[resource][device_id] = name
    clashes = tuple(
        sorted(
            (Clash(name, resource, device_id, names[name]) for name, resource, device_id in refused),
            key=lambda c: (c.name, c.resource, c.device_id),
        )
    )
    return Ownership(names, ids, clashes)


class Served(Protocol):
    """A served resource, as far as ownership goes (core/resource.py's ResourceService)."""

    @property
    def devices(self) -> Sequence[Device]: ...


class PoolOwners:
    """``decide`` over the devices the pool's resources serve now, done again only when a list
    changed (the lists are held, so compared by identity)."""

    def __init__(self, resources: Sequence[str], services: Callable[[], Mapping[str, Served]]) -> None:
        self.resources = tuple(resources)
        self._services = services
        self._decided: tuple[tuple[Sequence[Device], ...], Ownership] = ((), decide(()))

    def __call__(self) -> Ownership:
        served = self._services()
        lists = tuple(served[r].devices if r in served else () for r in self.resources)
        seen, ownership = self._decided
        if len(seen) != len(lists) or any(a is not b for a, b in zip(seen, lists, strict=True)):
            ownership = decide(tuple(zip(self.resources, lists, strict=True)))
            self._decided = (lists, ownership)
        return ownership


@dataclass(frozen=True, slots=True)
class Offer:
    """What a pool publishes now: its owned devices, named, and the clashes said (None: none)."""

    devices: list[PoolDevice]
    problem: str | None = None

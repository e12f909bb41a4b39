"""Device groups: the devices one Allocate gave one container, each device in one group at most.

v1beta1 never says when a container's devices are freed, so a new allocation of a device
supersedes the older group that held it. Kept with an index from device to group, so an
Allocate costs the size of its own group, not a pass over every group on the node.

Both the core's release tracker (core/release.py) and a driver's source (driverhost/source.py)
keep groups, so this sits below both.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

Group = tuple[str, ...]
V = TypeVar("V")


class DeviceGroups(Generic[V]):
    """Groups in the order they were added, each with a value (what its owner tracks of it)."""

    def __init__(self, groups: Iterable[Group] = (), value: V | None = None) -> None:
        self._groups: dict[Group, V | None] = {}
        self._owner: dict[str, Group] = {}
        for group in groups:
            self.add(group, value)

    def add(self, group: Group, value: V | None = None) -> bool:
        """``group`` is allocated now: every older group sharing a device with it is dropped
        (the same group again is renewed: moved last, with ``value``). False when the groups
        held are the same as before (a renewal), so the owner need not save them again."""
        renewed = group in self._groups
        self.drop_sharing(group)
        if group:
            self._groups[group] = value
            self._owner.update(dict.fromkeys(group, group))
        return not renewed and bool(group)

    def drop_sharing(self, device_ids: Iterable[str]) -> None:
        """Drop every group holding one of ``device_ids``."""
        for device_id in device_ids:
            group = self._owner.get(device_id)
            if group is not None:
                self.drop(group)

    def drop(self, group: Group) -> None:
        del self._groups[group]
        for device_id in group:
            self._owner.pop(device_id, None)

    def __getitem__(self, group: Group) -> V | None:
        return self._groups[group]

    def __setitem__(self, group: Group, value: V | None) -> None:
        if group not in self._groups:
            raise KeyError(group)  # only a held group's value changes; add() allocates
        self._groups[group] = value

    def __contains__(self, group: object) -> bool:
        return group in self._groups

    def holding(self, device_id: str) -> Group | None:
        """The group ``device_id`` is in, if any."""
        return self._owner.get(device_id)

    def __iter__(self) -> Iterator[Group]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def items(self) -> list[tuple[Group, V | None]]:
        return list(self._groups.items())

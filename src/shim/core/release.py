"""When devices devshim allocated are free again: Deallocate emulated for v1beta1.

v1beta1 never tells a plugin that a container is gone. The kubelet's PodResources
List shows which devices listed containers hold; a device group devshim allocated
is released once none of its devices is held and ``grace_s`` has passed since
that was first seen. The grace period matters: finished init containers never
appear in List, and an app container may be given its init container's devices
again (the same IDs, through a new Allocate, which renews the group).

Sans-I/O: the poller feeds observations in and acts on what comes out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shim.groups import DeviceGroups, Group


class ReleaseTracker:
    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        # resource -> its groups, each with when it was first seen free (None: not seen free)
        self._held: dict[str, DeviceGroups[float]] = {}

    def allocated(self, resource: str, device_ids: Sequence[str]) -> None:
        """A container got these devices; any older group holding one of them is superseded."""
        self._held.setdefault(resource, DeviceGroups()).add(tuple(device_ids))

    def released(self, resource: str, device_ids: Sequence[str]) -> None:
        """The kubelet released these itself (v1beta2 Deallocate): stop tracking their groups."""
        held = self._held.get(resource)
        if held is not None:
            held.drop_sharing(device_ids)

    def held(self, resource: str) -> list[Group]:
        held = self._held.get(resource)
        return list(held) if held is not None else []

    def observe(self, in_use: Mapping[str, set[str]], now: float) -> dict[str, list[Group]]:
        """Record what PodResources listed at ``now``; return the groups to deallocate now."""
        released: dict[str, list[Group]] = {}
        for resource, held in self._held.items():
            busy = in_use.get(resource, set())
            for group, free_since in held.items():
                if busy & set(group):
                    held[group] = None
                elif free_since is None:
                    held[group] = now
                elif now - free_since >= self.grace_s:
                    held.drop(group)
                    released.setdefault(resource, []).append(group)
        return released

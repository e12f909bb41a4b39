"""The health of a DRA driver's pool, as the kubelet's DRAResourceHealth stream wants it.

The kubelet (pkg/kubelet/cm/dra healthinfo.go, 1.37) takes each report as the state of the
devices it names, stamped with the time it arrived, and reads a device it has not heard of for
its timeout (the report's ``health_check_timeout_seconds``; 30 s when zero) as Unknown, then
forgets it. So every report names every device of the pool, and one goes out at least every
REPORT_EVERY_S even when nothing changed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from shim.core.api import ClaimResource
from shim.dra.ownership import PoolOwners
from shim.model import Health

TIMEOUT_S = 30  # told to the kubelet with each device
REPORT_EVERY_S = 10.0  # well inside it, so a busy node never lets a device go Unknown


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    device: str  # the DRA device name
    healthy: bool


class PoolHealth:
    def __init__(self, owners: PoolOwners, services: Callable[[], Mapping[str, ClaimResource]]) -> None:
        self.resources = owners.resources
        self._owners = owners
        self._services = services

    def report(self) -> list[DeviceHealth]:
        """Each device the pool publishes: one another resource's name clashes with is not its to
        report on (shim/dra/ownership.py)."""
        served, owned = self._services(), self._owners().ids
        return [
            DeviceHealth(ids[d.id], d.health is Health.HEALTHY)
            for r in self.resources
            if r in served and (ids := owned.get(r)) is not None
            for d in served[r].devices
            if d.id in ids
        ]

    async def reports(self) -> AsyncIterator[list[DeviceHealth]]:
        """The pool's health now, then again on every change and every REPORT_EVERY_S."""
        changed = asyncio.Event()
        following: dict[str, tuple[ClaimResource, asyncio.Task[None]]] = {}
        try:
            while True:
                for resource, service in self._services().items():
                    held = following.get(resource)
                    if resource in self.resources and (held is None or held[0] is not service):
                        if held is not None:
                            held[1].cancel()
                        following[resource] = (service, asyncio.create_task(_follow(service, changed)))
                changed.clear()
                yield self.report()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(REPORT_EVERY_S):
                        await changed.wait()
        finally:
            for _, task in following.values():
                task.cancel()


async def _follow(service: ClaimResource, changed: asyncio.Event) -> None:
    async for _ in service.watch():
        changed.set()

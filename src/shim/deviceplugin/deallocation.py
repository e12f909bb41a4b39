"""Deallocate for drivers on v1beta1: poll PodResources, release what no container holds.

Gentle by design: one List per ``poll_interval_s``, doubling (up to 16x) while the
kubelet answers RESOURCE_EXHAUSTED; when no PodResources service answers, the
emulation says it is off, in the log (once) and in ``status``, and keeps looking.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from loguru import logger

from shim.core.api import PluginResource
from shim.core.release import ReleaseTracker
from shim.node.podresources import PodResourcesClient, PodResourcesUnavailable, RateLimited
from shim.settings import DeallocationSettings

MAX_SLOWDOWN = 16


class DeallocationEmulator:
    def __init__(
        self, settings: DeallocationSettings, services: Callable[[], Mapping[str, PluginResource]]
    ) -> None:
        self.settings = settings
        self.tracker = ReleaseTracker(settings.grace_s)
        self._services = services
        self._client = PodResourcesClient(settings.pod_resources_socket)
        self.status = "starting"
        # What the last List said containers hold, per resource; set once the first List was
        # tried, answered or not (a DRA pool waits for it: core/holds.py).
        self.in_use: dict[str, set[str]] = {}
        self.first_list = asyncio.Event()

    async def run(self) -> None:
        slowdown = 1
        try:
            while True:
                slowdown = await self.poll_once(slowdown)
                await asyncio.sleep(self.settings.poll_interval_s * slowdown)
        finally:
            await self._client.close()

    async def poll_once(self, slowdown: int = 1) -> int:
        """One List and what follows from it; returns the slowdown factor for the next wait."""
        try:
            return await self._poll(slowdown)
        finally:
            self.first_list.set()

    async def _poll(self, slowdown: int) -> int:
        try:
            in_use = await self._client.devices_in_use()
        except RateLimited as exc:
            slowdown = min(MAX_SLOWDOWN, slowdown * 2)
            logger.warning("{}; polling every {:g} s for now", exc, self.settings.poll_interval_s * slowdown)
            return slowdown
        except PodResourcesUnavailable as exc:
            if not self.status.startswith("off"):
                logger.warning("deallocate emulation is off: {}", exc)
            self.status = f"off: {exc}"
            return MAX_SLOWDOWN
        if self.status != "on":
            logger.info("deallocate emulation is on (PodResources at {})", self._client.socket)
        self.status = "on"
        self.in_use = in_use
        for resource, shared in self._services().items():
            await shared.plugin_listed(in_use.get(resource, ()))
        for resource, groups in self.tracker.observe(in_use, time.monotonic()).items():
            service = self._services().get(resource)
            for group in groups if service else ():
                assert service is not None
                await service.deallocate(group)
        return 1

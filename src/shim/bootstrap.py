"""The composition root: the one place the object graph is built from settings."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Mapping
from types import TracebackType

from loguru import logger

from shim.core.resource import ResourceService
from shim.frontend.dirwatch import DirWatcher
from shim.frontend.endpoint import PluginEndpoint
from shim.frontend.v1beta1 import API as V1BETA1
from shim.settings import Settings
from shim.sources import DeviceSource, StaticSource


class Shim:
    """Every configured resource, served and registered, until ``stop``."""

    def __init__(self, settings: Settings, sources: Mapping[str, DeviceSource] | None = None) -> None:
        self.settings = settings
        sources = dict(sources or {})
        self.resources = [
            ResourceService(
                r.name,
                sources.pop(r.name) if r.name in sources else StaticSource.from_settings(r.static),
                prestart_timeout_s=settings.prestart_timeout_s,
            )
            for r in settings.resources
        ]
        if sources:
            raise ValueError(f"sources given for unconfigured resources: {', '.join(sources)}")
        self.endpoints = {
            service.name: PluginEndpoint(
                service,
                V1BETA1,
                plugin_dir=settings.device_plugins_dir,
                socket_name=r.socket,
                backoff_max_s=settings.register_backoff_max_s,
            )
            for service, r in zip(self.resources, settings.resources, strict=True)
        }
        self.watcher = DirWatcher(settings.device_plugins_dir, settings.watch_mode, settings.poll_interval_s)
        for endpoint in self.endpoints.values():
            self.watcher.subscribe(endpoint.check_files)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.settings.device_plugins_dir.mkdir(parents=True, exist_ok=True)
        for endpoint in self.endpoints.values():
            endpoint.preflight()
        for service in self.resources:
            await service.start()
        self._tasks = [asyncio.create_task(e.run(), name=f"endpoint:{n}") for n, e in self.endpoints.items()]
        self._tasks.append(asyncio.create_task(self.watcher.run(), name="dirwatch"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for endpoint in self.endpoints.values():
            await endpoint.close()
        for service in self.resources:
            await service.stop()

    async def wait(self) -> None:
        """Until stopped, or until a part fails (its exception is raised here)."""
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()

    async def __aenter__(self) -> Shim:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def run(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT, then remove our sockets and return."""
    loop = asyncio.get_running_loop()
    shim = Shim(settings)
    await shim.start()
    serving = asyncio.create_task(shim.wait())
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if serving.done():
            serving.result()
        logger.info("signal received; shutting down")
    finally:
        serving.cancel()
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await shim.stop()

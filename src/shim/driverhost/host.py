"""One driver subprocess: start it, initialize it, follow its notifications, stop it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from loguru import logger

from shim import __version__
from shim.driverhost import protocol
from shim.driverhost.source import DriverSource
from shim.errors import ShimError, SourceUnavailable
from shim.jsonrpc import MAX_LINE_BYTES, Peer, StreamTransport
from shim.settings import DriverSettings, DriverTimeouts
from shim.sources.base import DeviceSource

_LOG_LEVELS = {"DEBUG": "DEBUG", "INFO": "INFO", "WARNING": "WARNING", "ERROR": "ERROR"}


class ResourceRegistry(Protocol):
    """Where a driver's resources are served (the composition root implements it)."""

    async def add_resource(self, name: str, source: DeviceSource) -> None: ...

    async def remove_resource(self, name: str) -> None: ...


class DriverHost:
    def __init__(self, settings: DriverSettings, registry: ResourceRegistry) -> None:
        self.settings = settings
        self.name = settings.name
        self._registry = registry
        self._timeouts: DriverTimeouts = settings.timeouts
        self.process: asyncio.subprocess.Process | None = None
        self._peer: Peer | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sources: dict[str, DriverSource] = {}

    # --- start -----------------------------------------------------------

    async def start(self) -> None:
        """Start the driver, initialize it, list and serve every resource it declares."""
        argv = self.settings.command
        try:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(self.settings.env),
                limit=MAX_LINE_BYTES,
            )
        except OSError as exc:
            raise SourceUnavailable(
                f"driver {self.name!r}: cannot start {argv[0]!r}: {exc.strerror}"
            ) from None
        assert self.process.stdout and self.process.stdin and self.process.stderr
        self._peer = Peer(
            StreamTransport(self.process.stdout, self.process.stdin),
            name=f"driver {self.name!r}",
            notifications={
                "devices_changed": self._on_devices_changed,
                "health_changed": self._on_health_changed,
                "resources_changed": self._on_resources_changed,
                "log": self._on_log,
            },
        )
        self._peer.on_close = self._on_connection_lost
        self._spawn(self._peer.run())
        self._spawn(self._copy_log(self.process.stderr))
        result = await self.call(
            "initialize",
            {
                "protocol_version": protocol.PROTOCOL_VERSION,
                "devshim_version": __version__,
                "allocations": [],
            },
        )
        try:
            protocol.check_protocol_version(protocol.field(result, "protocol_version"))
            resources = protocol.resources_from_json(result)
        except ShimError as exc:
            raise protocol.error_for(self.name, "initialize", exc) from None
        for info in resources:
            await self._add(info)
        logger.info(
            "driver {!r}: serving {}", self.name, ", ".join(r.name for r in resources) or "no resources"
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _add(self, info: protocol.ResourceInfo) -> None:
        source = DriverSource(info, self.call)
        await source.refresh()
        self.sources[info.name] = source
        await self._registry.add_resource(info.name, source)

    # --- calls -----------------------------------------------------------

    async def call(self, method: str, params: Any) -> Any:
        """One request to the driver, its failure mapped to what the kubelet should see."""
        if self._peer is None:
            raise SourceUnavailable(f"driver {self.name!r}: {method}: not started")
        timeout = getattr(self._timeouts, f"{method}_s")
        try:
            return await self._peer.request(method, params, timeout)
        except Exception as exc:
            raise protocol.error_for(self.name, method, exc) from None

    # --- notifications ---------------------------------------------------

    def _source(self, params: Any) -> DriverSource | None:
        name = protocol.field(params, "resource")
        source = self.sources.get(name) if isinstance(name, str) else None
        if source is None:
            logger.warning("driver {!r}: notification for unknown resource {!r}", self.name, name)
        return source

    def _on_devices_changed(self, params: Any) -> None:
        if source := self._source(params):
            self._spawn(source.set_devices(protocol.devices_from_json(params)))

    def _on_health_changed(self, params: Any) -> None:
        if source := self._source(params):
            changes = {
                str(protocol.field(c, "id")): protocol.health_from_json(protocol.field(c, "health"))
                for c in protocol.field(params, "changes") or ()
            }
            self._spawn(source.set_health(changes))

    def _on_resources_changed(self, params: Any) -> None:
        self._spawn(self._apply_resources(protocol.resources_from_json(params)))

    async def _apply_resources(self, resources: list[protocol.ResourceInfo]) -> None:
        wanted = {r.name: r for r in resources}
        for name in [n for n in self.sources if n not in wanted]:
            del self.sources[name]
            await self._registry.remove_resource(name)
        for name, info in wanted.items():
            if name not in self.sources:
                try:
                    await self._add(info)
                except ShimError as exc:
                    logger.error("driver {!r}: cannot add resource {}: {}", self.name, name, exc)

    def _on_log(self, params: Any) -> None:
        level = _LOG_LEVELS.get(str(protocol.field(params, "level")), "INFO")
        logger.log(level, "driver {!r}: {}", self.name, protocol.field(params, "message", ""))

    async def _copy_log(self, stderr: asyncio.StreamReader) -> None:
        with contextlib.suppress(ValueError, ConnectionError):
            async for line in stderr:
                logger.info("driver {!r}: {}", self.name, line.decode(errors="replace").rstrip())

    def _on_connection_lost(self, reason: BaseException) -> None:
        if self._stopping:
            return
        logger.error("driver {!r} stopped answering ({}); its devices are Unhealthy", self.name, reason)
        for source in self.sources.values():
            self._spawn(source.all_unhealthy())

    # --- stop ------------------------------------------------------------

    _stopping = False

    async def stop(self) -> None:
        """shutdown, then close stdin, then SIGTERM, then SIGKILL, each bounded."""
        self._stopping = True
        if self._peer is not None and not self._peer.closed:
            with contextlib.suppress(ShimError):
                await self.call("shutdown", {})
            await self._peer.close()
        process = self.process
        if process is not None and process.returncode is None:
            try:
                await asyncio.wait_for(process.wait(), self._timeouts.shutdown_s)
            except TimeoutError:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), self._timeouts.shutdown_s)
                except TimeoutError:
                    process.kill()
                    await process.wait()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

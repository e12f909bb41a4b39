"""The kubelet's side, played to one legacy plugin: accept its Register, dial it, follow it.

Reuses the fake kubelet's v1beta1 module (installed as devshim_compat), which
already speaks the kubelet side of the API; here it serves a private directory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from loguru import logger

from devshim_compat import records, v1beta1
from devshim_compat.errors import RegistrationRejected
from devshim_compat.names import is_extended_resource_name

# Kubelets dial the plugin for up to 10 s (devicemanager client.go); a plugin that
# registers before it serves (an old, common bug) got more time from kubelets up to
# 1.24, which dialed after answering Register: be as patient as they were.
CONNECT_PATIENCE_S = 30.0

OnList = Callable[["LegacyPlugin", tuple[records.DeviceState, ...]], Awaitable[None]]
OnGone = Callable[["LegacyPlugin"], Awaitable[None]]


class LegacyPlugin:
    """One registered legacy plugin: its client, its options, its ListAndWatch."""

    def __init__(self, resource: str, socket: Path) -> None:
        self.resource = resource
        self.socket = socket
        self.client = v1beta1.PluginClientV1Beta1(socket)
        self.options = records.PluginOptions()
        self.task: asyncio.Task[None] | None = None

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.client.close()


class PrivateKubelet:
    """Serves v1beta1 Registration on ``directory``/kubelet.sock for the legacy plugin(s)."""

    def __init__(self, directory: Path, on_list: OnList, on_gone: OnGone, socket_mode: int = 0o600) -> None:
        self.directory = directory
        self.plugins: dict[str, LegacyPlugin] = {}
        self._on_list = on_list
        self._on_gone = on_gone
        self._socket_mode = socket_mode
        self._server: grpc.aio.Server | None = None
        self.registered = asyncio.Event()

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        v1beta1.add_registration_service(server, self._register)
        server.add_insecure_port(f"unix:{self.socket}")
        await server.start()
        # A legacy container running as another user must be able to connect.
        self.socket.chmod(self._socket_mode)
        self._server = server
        logger.info("serving the kubelet's Registration on {}", self.socket)

    async def stop(self) -> None:
        for plugin in self.plugins.values():
            await plugin.close()
        if self._server is not None:
            await self._server.stop(None)
        self.socket.unlink(missing_ok=True)

    async def _register(self, request: records.RegisterRequest, received_at: float) -> None:
        # The kubelet's own checks (devicemanager plugin/v1beta1 server.go Register).
        if request.version != v1beta1.VERSION:
            raise RegistrationRejected(
                f"unsupported API version {request.version!r}; this kubelet speaks v1beta1"
            )
        if not is_extended_resource_name(request.resource_name):
            raise RegistrationRejected(f"invalid resource name {request.resource_name!r}")
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await old.close()
        plugin = LegacyPlugin(request.resource_name, self.directory / request.endpoint)
        self.plugins[plugin.resource] = plugin
        plugin.task = asyncio.create_task(self._follow(plugin, request.options))
        logger.info("{} registered (endpoint {})", plugin.resource, request.endpoint)

    async def _follow(self, plugin: LegacyPlugin, sent: records.PluginOptions | None) -> None:
        try:
            await asyncio.wait_for(plugin.client.connect(), CONNECT_PATIENCE_S)
            try:
                plugin.options = await plugin.client.get_options(timeout=10)
            except grpc.aio.AioRpcError:
                plugin.options = sent or records.PluginOptions()  # kubelets up to 1.24 used these
            self.registered.set()
            async for devices in plugin.client.list_and_watch():
                await self._on_list(plugin, devices)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            logger.warning("{}: lost the legacy plugin: {}", plugin.resource, _describe(exc))
        finally:
            with contextlib.suppress(Exception):
                await self._on_gone(plugin)


def _describe(exc: Any) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return "it did not answer on its socket in time"

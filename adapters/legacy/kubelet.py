"""The kubelet's side, played to one legacy plugin: accept its Register, dial it, follow it.

Reuses the fake kubelet's v1beta1 module (shim.compat.fakekubelet), which already speaks the kubelet side
of the API; here it serves a private directory.
That directory may be writable by the legacy plugin's container (the sidecar form),
so every file in it is handled as sockets.py describes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
from loguru import logger

from shim.compat.fakekubelet import records, v1beta1
from shim.compat.fakekubelet.errors import RegistrationRejected
from shim.compat.fakekubelet.names import is_extended_resource_name
from shim.facts import KUBELET_SOCKET

from .sockets import EndpointRefused, Identity, PinnedSocket, PrivateBind, SharedDir

# Kubelets dial the plugin for up to 10 s (devicemanager client.go); a plugin that
# registers before it serves (an old, common bug) got more time from kubelets up to
# 1.24, which dialed after answering Register: be as patient as they were.
CONNECT_PATIENCE_S = 30.0
# While waiting: how often to look for a socket not there yet, and whether the one we
# pinned is still the one under its name (a plugin may re-create it before serving).
APPEAR_POLL_S = 0.1
RECHECK_S = 1.0

OnList = Callable[["LegacyPlugin", tuple[records.DeviceState, ...]], Awaitable[None]]
OnGone = Callable[["LegacyPlugin"], Awaitable[None]]


class NotConnected(Exception):
    """The legacy plugin's socket has not been dialled (yet, or any more)."""


class LegacyPlugin:
    """One registered legacy plugin: its endpoint, its client once dialled, its options, its ListAndWatch."""

    def __init__(self, resource: str, endpoint: str) -> None:
        self.resource = resource
        self.endpoint = endpoint  # a plain name in the kubelet dir (checked at Register)
        self.options = records.PluginOptions()
        self.task: asyncio.Task[None] | None = None
        self.pinned: PinnedSocket | None = None
        self._client: v1beta1.PluginClientV1Beta1 | None = None

    @property
    def connected(self) -> bool:
        return self._client is not None

    @property
    def client(self) -> v1beta1.PluginClientV1Beta1:
        if self._client is None:
            raise NotConnected(f"{self.resource}: the legacy plugin's socket is not dialled")
        return self._client

    def attach(self, pinned: PinnedSocket) -> None:
        self.pinned = pinned
        self._client = v1beta1.PluginClientV1Beta1(pinned.dial_path)

    async def detach(self) -> None:
        # The channel before the descriptor: a channel still dialling must not reach whatever
        # file a reused descriptor number names next.
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
        if self.pinned is not None:
            self.pinned.close()
            self.pinned = None

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.detach()


class PrivateKubelet:
    """Serves v1beta1 Registration on ``directory``/kubelet.sock for the legacy plugin(s).

    ``allowed_resources``: when not empty, the only resource names a plugin may register.
    """

    def __init__(
        self,
        directory: Path,
        on_list: OnList,
        on_gone: OnGone,
        socket_mode: int = 0o600,
        allowed_resources: Iterable[str] = (),
    ) -> None:
        self.directory = directory
        self.plugins: dict[str, LegacyPlugin] = {}
        self._on_list = on_list
        self._on_gone = on_gone
        self._socket_mode = socket_mode
        self._allowed = frozenset(allowed_resources)
        self._server: grpc.aio.Server | None = None
        self._shared: SharedDir | None = None
        self._bind: PrivateBind | None = None
        self._created: Identity | None = None

    @property
    def socket(self) -> Path:
        return self.directory / KUBELET_SOCKET

    async def start(self) -> None:
        shared = self._shared = SharedDir(self.directory)
        bind = self._bind = PrivateBind(shared, KUBELET_SOCKET)
        server = self._server = grpc.aio.server()
        v1beta1.add_registration_service(server, self._register)
        server.add_insecure_port(f"unix:{bind.path}")
        await server.start()
        # It gets its mode (a legacy container running as another user must be able to
        # connect) before it appears under its name.
        self._created = bind.publish(self._socket_mode)
        logger.info("serving the kubelet's Registration on {}", self.socket)

    async def stop(self) -> None:
        for plugin in self.plugins.values():
            await plugin.close()
        if self._server is not None:
            await self._server.stop(None)
        if self._bind is not None:
            self._bind.close()  # after the server: gRPC removes its socket by the bound path
        if self._shared is not None:
            self._shared.remove_if(KUBELET_SOCKET, self._created)  # ours only, never a swapped-in file
            self._shared.close()

    def _refuse(self, request: records.RegisterRequest, why: str) -> RegistrationRejected:
        logger.warning("refused the Register of {!r}: {}", request.resource_name, why)
        return RegistrationRejected(why)

    async def _register(self, request: records.RegisterRequest, received_at: float) -> None:
        # The kubelet's own checks (devicemanager plugin/v1beta1 server.go Register), then ours: a
        # resource this adapter is meant to serve, on a socket of the plugin's own in this directory
        # (the kubelet trusts its root-only device-plugins dir; this one may be shared).
        if request.version != v1beta1.VERSION:
            raise self._refuse(
                request, f"unsupported API version {request.version!r}; this kubelet speaks v1beta1"
            )
        if not is_extended_resource_name(request.resource_name):
            raise self._refuse(request, f"invalid resource name {request.resource_name!r}")
        if self._allowed and request.resource_name not in self._allowed:
            raise self._refuse(
                request,
                f"resource name {request.resource_name!r} is not one this adapter serves (--resource)",
            )
        assert self._shared is not None  # Register is served only once started
        try:
            self._shared.check_endpoint(request.endpoint)
        except EndpointRefused as refused:
            raise self._refuse(request, str(refused)) from None
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await old.close()
        plugin = LegacyPlugin(request.resource_name, request.endpoint)
        self.plugins[plugin.resource] = plugin
        plugin.task = asyncio.create_task(self._follow(plugin, request.options))
        logger.info("{} registered (endpoint {})", plugin.resource, request.endpoint)

    async def _follow(self, plugin: LegacyPlugin, sent: records.PluginOptions | None) -> None:
        try:
            await self._dial(plugin)
            try:
                plugin.options = await plugin.client.get_options(timeout=10)
            except grpc.aio.AioRpcError:
                plugin.options = sent or records.PluginOptions()  # kubelets up to 1.24 used these
            async for devices in plugin.client.list_and_watch():
                await self._on_list(plugin, devices)
        except EndpointRefused as refused:
            logger.warning("{}: refused to dial the legacy plugin: {}", plugin.resource, refused)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            logger.warning("{}: lost the legacy plugin: {}", plugin.resource, _describe(exc))
        finally:
            await plugin.detach()
            with contextlib.suppress(Exception):
                await self._on_gone(plugin)

    async def _dial(self, plugin: LegacyPlugin) -> None:
        """Connect to the socket under the plugin's endpoint name, pinned as sockets.py says:
        wait for it to appear and to answer, pinning it again if it is re-created meanwhile."""
        assert self._shared is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONNECT_PATIENCE_S
        while (remaining := deadline - loop.time()) > 0:
            pinned = plugin.pinned
            if pinned is None or self._shared.identity(plugin.endpoint) != pinned.identity:
                await plugin.detach()
                pinned = self._shared.pin(plugin.endpoint)  # raises EndpointRefused
                if pinned is None:
                    await asyncio.sleep(min(APPEAR_POLL_S, remaining))
                    continue
                plugin.attach(pinned)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(RECHECK_S, remaining)):
                    await plugin.client.connect()
                return
        raise TimeoutError


def _describe(exc: Any) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return "it did not answer on its socket in time"

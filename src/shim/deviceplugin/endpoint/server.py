"""The plugin's gRPC server on its socket: every offered version's DevicePlugin service, health,
reflection and, in watcher mode, the registration service the plugin watcher calls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from shim.core.api import PluginResource
from shim.deviceplugin.api import ApiVersion, ListRefused, ServedVersion
from shim.errors import ShimError
from shim.node import sockets
from shim.node.pluginregistration import add_registration_service
from shim.settings import SocketSettings

# The most a closing server waits for unary calls in flight to finish; it goes on as soon as they
# have. A driver's answer comes within milliseconds, a hung driver's call ends at its own deadline
# (timeouts.allocate_s), and a restarted kubelet's calls end at once with its connections. The cap
# is for a busy machine: 1 s was missed on two loaded cores, failing an answered Allocate.
# Registering again waits for it, while the kubelet's old registration still stands.
UNARY_GRACE_S = 5.0


class SocketGone(ShimError):
    """Our socket vanished (a restarting kubelet cleaned the directory): serve again at once.
    The endpoint cycle's own signal, never a kubelet's answer (UNAVAILABLE, were it one)."""

    status = grpc.StatusCode.UNAVAILABLE


class PluginServer:
    """One server at a time on ``socket_path``: ``serve_fresh`` closes the old one first."""

    def __init__(
        self,
        resource: PluginResource,
        apis: Sequence[ApiVersion],
        socket_path: Path,
        socket_settings: SocketSettings,
        *,
        on_stream_end: Callable[[ListRefused | None], None],
        on_watcher_status: Callable[[bool, str], None] | None,
    ) -> None:
        """``on_watcher_status`` given: also serve the plugin watcher's registration service."""
        self.resource = resource
        self.apis = tuple(apis)
        self.socket_path = socket_path
        self._socket_settings = socket_settings
        self._on_stream_end = on_stream_end
        self._on_watcher_status = on_watcher_status
        self._server: grpc.aio.Server | None = None
        self._served: list[ServedVersion] = []
        self._identity: sockets.FileIdentity | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    async def serve_fresh(self) -> sockets.FileIdentity:
        """A new server on a new socket; the socket's identity once published."""
        # Close every old stream and the old server *before* registering again: on current
        # kubelets a late close of the old stream tears down the new registration
        # (kubernetes/kubernetes#121994).
        await self.close()
        sockets.clear_stale_socket(self.socket_path)
        server = grpc.aio.server()
        self._served = [api.add_services(server, self.resource, self._on_stream_end) for api in self.apis]
        names = [name for api in self.apis for name in api.service_names]
        health_servicer = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        services = [*names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        if self._on_watcher_status is not None:
            versions = tuple(api.name for api in self.apis)
            services.append(
                add_registration_service(server, self.resource.name, versions, self._on_watcher_status)
            )
        reflection.enable_server_reflection(services, server)
        # Bound where nobody can connect yet; the kubelet sees the socket only once it serves,
        # with its final permissions (node/sockets.py).
        with sockets.PrivateBind(self.socket_path, self._socket_settings) as bind:
            server.add_insecure_port(f"unix:{bind.path}")
            await server.start()
            self._server = server
            for service in ("", *names):
                await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
            try:
                self._identity = bind.publish()
            except FileNotFoundError:
                raise SocketGone from None
        return self._identity

    async def close(self) -> None:
        if self._server is None:
            return
        for served in self._served:
            served.retire()
        server, self._server = self._server, None
        try:
            # An Allocate in flight gets to finish rather than reach the kubelet as gRPC's
            # "Cancelling all calls"; while the streams stay open, as the kubelet closes its
            # connection, and every call on it, once a stream ends (devicemanager handler.go
            # runClient).
            calls = [call for served in self._served for call in served.calls_in_flight()]
            if calls:  # no loop turn otherwise: registering again waits for this
                await asyncio.wait(calls, timeout=UNARY_GRACE_S)
        finally:
            # Stopped even if we are cancelled meanwhile (devshim shutting down): a server left
            # running keeps the process from exiting.
            await asyncio.shield(server.stop(grace=None))
            sockets.remove_own_socket(self.socket_path, self._identity)
            self._identity = None

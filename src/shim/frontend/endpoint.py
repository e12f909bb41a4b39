"""One resource's plugin endpoint: its socket, its gRPC server, its kubelet registration.

Life cycle, repeated for every kubelet restart:

    serve (fresh server, fresh socket) -> Register (retried) -> registered
        -> restart noticed -> close old streams and server -> serve ...

A restart is noticed three ways, each checked against the facts on disk
(``check_files``) so a late or duplicate signal cannot cause a needless cycle:
our socket deleted, kubelet.sock re-created, the kubelet ending ListAndWatch.
A device list devshim cannot send (too large for the kubelet, or not encodable) ends the
cycle too (devshim ends the stream): the endpoint registers again only once the list has changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from loguru import logger
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from shim.core.resource import ResourceService
from shim.frontend import sockets
from shim.frontend.api import ApiVersion, ListRefused, ServedVersion
from shim.frontend.handover import Handover
from shim.frontend.pluginregistration import add_registration_service
from shim.ops import metrics
from shim.settings import KUBELET_SOCKET_NAME, SocketSettings

# The kubelet dials the plugin inside Register and gives up after 10 s
# (devicemanager/plugin/v1beta1/client.go dial()); allow for that and the options call.
REGISTER_TIMEOUT_S = 15.0
# How long a closing server lets unary calls in flight finish. Short: registering again waits for
# it; a restarted kubelet's calls end at once with its connections anyway.
UNARY_GRACE_S = 1.0


def _version_refused(exc: grpc.aio.AioRpcError) -> bool:
    """A kubelet without this version: no such Registration service (UNIMPLEMENTED), or its
    answer to an unknown version (devicemanager server.go: errUnsupportedVersion)."""
    return exc.code() is grpc.StatusCode.UNIMPLEMENTED or "is not supported" in (exc.details() or "")


class RegistrationFailed(Exception):
    """One Register attempt failed; retried with backoff."""


class SocketGone(Exception):
    """Our socket vanished while registering: serve again before retrying."""


class PluginEndpoint:
    def __init__(
        self,
        resource: ResourceService,
        apis: Sequence[ApiVersion],
        *,
        plugin_dir: Path,
        socket_name: str,
        backoff_max_s: float = 5.0,
        plugins_registry: Path | None = None,
        handover: Handover | None = None,
        socket: SocketSettings | None = None,
    ) -> None:
        """``plugins_registry`` given: register through the kubelet's plugin watcher (a
        registration socket there) instead of calling Register on kubelet.sock. ``handover``:
        take the resource over from another devshim instance first, and let go when asked.
        ``socket``: the socket's permissions (default: owner only)."""
        self._socket_settings = socket or SocketSettings()
        self.resource = resource
        self._handover = handover
        self.handed_over = asyncio.Event()
        # The versions offered, newest first: one socket hosts each one's DevicePlugin service.
        self.apis = tuple(apis)
        self.negotiated = ""  # the version the kubelet registered us with, last time
        self.watcher_mode = plugins_registry is not None
        self.socket_path = (plugins_registry or plugin_dir) / socket_name
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET_NAME
        self._backoff_max_s = backoff_max_s
        self._server: grpc.aio.Server | None = None
        self._served: list[ServedVersion] = []
        self._socket_identity: sockets.FileIdentity | None = None
        self._registered_with: sockets.FileIdentity | None = None
        self._attempted_with: sockets.FileIdentity | None = None
        self._told_waiting = False
        self._restart = asyncio.Event()
        self._kubelet_seen = asyncio.Event()
        self.registrations = 0
        self.watcher_status = ""  # the plugin watcher's last word, in watcher mode
        self.last_error = ""  # why the last Register failed or the last list was refused, if so
        self._pause_before_serving = False
        self._refused: ListRefused | None = None  # a list devshim could not send, until it changes

    @property
    def registered(self) -> bool:
        """Registered with the kubelet now (what readiness means)."""
        if self.watcher_mode:
            return self._server is not None and self.watcher_status == "registered"
        return self._registered_with is not None

    # --- signals ---------------------------------------------------------

    def check_files(self, name: str | None = None) -> None:
        """React to a directory change (``name`` None: anything may have changed)."""
        if self._handover is not None and not self.handed_over.is_set() and self._handover.asked(name):
            logger.info("{}: another devshim instance takes it over; letting go", self.resource.name)
            self.handed_over.set()
            self._restart.set()
            return
        if name not in (None, KUBELET_SOCKET_NAME, self.socket_path.name) or self._server is None:
            return
        if sockets.identity(self.socket_path) != self._socket_identity:
            self._request_restart("socket_removed", "our socket was deleted or replaced")
        if self.watcher_mode:
            return
        kubelet = sockets.identity(self.kubelet_socket)
        if kubelet is not None:
            if kubelet != self._attempted_with:
                self._kubelet_seen.set()
            if self._registered_with is not None and kubelet != self._registered_with:
                self._request_restart("kubelet_socket_recreated", "kubelet.sock was re-created")

    def _on_stream_end(self, refused: ListRefused | None = None) -> None:
        if refused is not None:
            # Registering again would only fail the same way: wait for another list (run()).
            logger.info("{}: serving again once its device list changes", self.resource.name)
            self._refused = refused
            self._show_refusal(refused)
            self._restart.set()
        elif self.watcher_mode:
            # The kubelet finds our registration socket again itself (it re-walks
            # plugins_registry after a restart); keep serving for its next connection.
            logger.info("{}: the kubelet ended ListAndWatch; serving on for its return", self.resource.name)
        elif self._registered_with is not None:
            self._request_restart("stream_ended", "the kubelet ended ListAndWatch")

    def _on_watcher_status(self, registered: bool, error: str) -> None:
        self.watcher_status = "registered" if registered else f"refused: {error}"
        metrics.registration(self.resource.name, "", registered)  # the watcher does not say which version
        if registered:
            self.registrations += 1
            self.last_error = ""  # a refused list's error, which registering again follows
        else:
            # The watcher only acts on new sockets: offer a fresh one after a pause.
            self._request_restart("watcher_refused", f"the plugin watcher refused it ({error})", pause=True)

    def _request_restart(self, cause: metrics.RestartReason, reason: str, pause: bool = False) -> None:
        if not self._restart.is_set():
            metrics.restart_noticed(self.resource.name, cause)
            logger.info("{}: {}; registering again", self.resource.name, reason)
            self._pause_before_serving = pause
            self._restart.set()

    # --- the cycle -------------------------------------------------------

    def preflight(self) -> None:
        """Fail at start, not in the background, when our socket path is unusable."""
        sockets.clear_stale_socket(self.socket_path)

    async def run(self) -> None:
        """Serve and stay registered until cancelled; no error ends the cycle."""
        while True:
            self._restart.clear()
            self._registered_with = None
            if self.handed_over.is_set():
                # Close our streams now, before the new instance registers (frontend/handover.py).
                await self._close_server()
                assert self._handover is not None
                why = await self._handover.until_successor_gone()
                logger.warning("{}: {}; serving it again", self.resource.name, why)
                self.handed_over.clear()
                continue
            if self._refused is not None:
                await self._wait_for_another_list(self._refused)
                self._refused = None
                continue  # handed over meanwhile, or serve again
            if self._pause_before_serving:
                self._pause_before_serving = False
                await asyncio.sleep(self._backoff_max_s)
            try:
                if self._handover is not None:
                    await self._handover.take_over()
                await self._serve_fresh()
                if not self.watcher_mode:
                    await self._register_with_retry()
            except SocketGone:
                # A restarting kubelet cleaned the directory under us: serve again at once.
                continue
            except Exception as exc:
                logger.error(
                    "{}: cannot serve: {}; trying again in {}s", self.resource.name, exc, self._backoff_max_s
                )
                await asyncio.sleep(self._backoff_max_s)
                continue
            await self._restart.wait()

    async def _wait_for_another_list(self, refused: ListRefused) -> None:
        """Not registered (status shows why) until the resource publishes a different list, and
        at least the backoff has passed; or until another instance takes it over. The old server
        stays until then: removing its socket now could make a watcher kubelet disconnect before
        it has read the refusal's status."""
        self._show_refusal(refused)  # again: a Register answered after the refusal cleared it

        async def another_list() -> None:
            await asyncio.sleep(self._backoff_max_s)  # a list changing often is no busy loop either
            async with contextlib.aclosing(self.resource.watch()) as lists:
                async for devices in lists:
                    if devices is not refused.devices and devices != refused.devices:
                        return

        waits = [asyncio.create_task(another_list()), asyncio.create_task(self.handed_over.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def _show_refusal(self, refused: ListRefused) -> None:
        self.last_error = refused.reason
        if self.watcher_mode:
            self.watcher_status = "device list not sent to the kubelet"  # last_error says why

    async def _serve_fresh(self) -> None:
        # Close every old stream and the old server *before* registering again: on
        # current kubelets a late close of the old stream tears down the new
        # registration (kubernetes/kubernetes#121994).
        await self._close_server()
        sockets.clear_stale_socket(self.socket_path)
        server = grpc.aio.server()
        self._served = [api.add_services(server, self.resource, self._on_stream_end) for api in self.apis]
        names = [name for api in self.apis for name in api.service_names]
        health_servicer = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        services = [*names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        if self.watcher_mode:
            services.append(
                add_registration_service(
                    server, self.resource.name, tuple(api.name for api in self.apis), self._on_watcher_status
                )
            )
        reflection.enable_server_reflection(services, server)
        # Bound where nobody can connect yet; the kubelet sees the socket only once it serves,
        # with its final permissions (frontend/sockets.py).
        with sockets.PrivateBind(self.socket_path, self._socket_settings) as bind:
            server.add_insecure_port(f"unix:{bind.path}")
            await server.start()
            self._server = server
            for service in ("", *names):
                await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
            if self.watcher_mode:
                self.watcher_status = "waiting for the plugin watcher"
            try:
                self._socket_identity = bind.publish()
            except FileNotFoundError:
                raise SocketGone from None
        logger.info(
            "{}: serving {} on {}", self.resource.name, ", ".join(a.name for a in self.apis), self.socket_path
        )

    async def _register_with_retry(self) -> None:
        # Serve first, then register: the kubelet dials us inside Register (>= 1.25).
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(RegistrationFailed),
            wait=wait_exponential(multiplier=0.05, max=self._backoff_max_s),
            sleep=self._sleep_until_kubelet,
        )
        async for attempt in retrying:
            with attempt:
                await self._register_once()

    async def _register_once(self) -> None:
        if sockets.identity(self.socket_path) != self._socket_identity:
            raise SocketGone
        self._kubelet_seen.clear()
        kubelet = self._attempted_with = sockets.identity(self.kubelet_socket)
        if kubelet is None:
            if not self._told_waiting:
                logger.info(
                    "{}: waiting for the kubelet to create {}", self.resource.name, self.kubelet_socket
                )
                self._told_waiting = True
            raise RegistrationFailed
        self._told_waiting = False
        started = time.monotonic()
        version = await self._unless_restarted(self._negotiate())
        self._registered_with = kubelet
        self.last_error = ""
        self.registrations += 1
        self.negotiated = version
        metrics.registration(self.resource.name, version, ok=True)
        metrics.negotiated(self.resource.name, version)
        logger.info(
            "{}: registered with the kubelet as {} ({} ms)",
            self.resource.name,
            version,
            round((time.monotonic() - started) * 1000),
        )

    async def _unless_restarted(self, registering: Coroutine[Any, Any, str]) -> str:
        """The Register's outcome, unless a restart signal (our socket deleted, a handover) comes
        first: then the attempt is abandoned, since a kubelet dialling a gone socket can only time
        out (10 s), and the cycle serves afresh."""
        register = asyncio.ensure_future(registering)
        restart = asyncio.ensure_future(self._restart.wait())
        try:
            await asyncio.wait({register, restart}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            restart.cancel()
            if not register.done():
                register.cancel()
            await asyncio.gather(register, restart, return_exceptions=True)
        if register.cancelled():
            raise SocketGone
        return register.result()

    async def _negotiate(self) -> str:
        """Register through the newest offered version the kubelet speaks; the version it took."""
        for api in self.apis:
            try:
                await api.register(
                    self.kubelet_socket, self.socket_path.name, self.resource, REGISTER_TIMEOUT_S
                )
                return api.name
            except grpc.aio.AioRpcError as exc:
                if not _version_refused(exc) or api is self.apis[-1]:
                    self.last_error = f"Register ({api.name}): {exc.code().name}: {exc.details()}"
                    metrics.registration(self.resource.name, api.name, ok=False)
                    logger.warning(
                        "{}: Register ({}) failed: {}: {}",
                        self.resource.name,
                        api.name,
                        exc.code().name,
                        exc.details(),
                    )
                    raise RegistrationFailed from exc
                logger.info(
                    "{}: the kubelet does not speak {}; trying an older version", self.resource.name, api.name
                )
        raise RegistrationFailed

    async def _sleep_until_kubelet(self, seconds: float) -> None:
        """Back off, but wake at once when kubelet.sock appears."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._kubelet_seen.wait()

    # --- shutdown --------------------------------------------------------

    async def _close_server(self) -> None:
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
            sockets.remove_own_socket(self.socket_path, self._socket_identity)
            # No socket of ours until the next one is published: its absence is no restart signal.
            self._socket_identity = None

    async def close(self) -> None:
        await self._close_server()
        metrics.endpoint_closed(self.resource.name)

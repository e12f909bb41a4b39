"""A fake kubelet device manager: serves Registration and drives registered plugins.

It behaves like pkg/kubelet/cm/devicemanager (manager.go, plugin/v1beta1/{server,handler,
client}.go) of the kubelet release its profile names (profiles.py), over real unix sockets, so
a device plugin (the shim, an adapter) can be tested without a node. It records what it saw as
version-neutral records.
Optionally it also finds plugins in plugins_registry, as pkg/kubelet/pluginmanager does
(watcher.py, registrar.py), and runs pods whose devices it serves over PodResources (pods.py,
podresources.py). It speaks v1beta1, devshim's experimental v1beta2, or both (versions.py); a
restart may change which.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from shim.facts import KUBELET_SOCKET

from . import podresources
from .connect import check_register, connect_session
from .dirs import CleanupMode, clean_plugin_dir
from .errors import RegistrationRejected
from .pods import PodTable
from .profiles import DEPRECATION_FILE, Profile, profile_named
from .ratelimit import DEFAULT_BURST, DEFAULT_QPS
from .records import (
    ContainerSpec,
    Notification,
    PluginOptions,
    RegisterRequest,
    RegistrationRecord,
    RunningPod,
)
from .registrar import Registrar
from .session import PluginSession
from .versions import WIRES, newest_first
from .watcher import PluginWatcher, WatchMode


class FakeKubelet:
    """The kubelet's device manager, faked. Use `async with FakeKubelet(dir) as kubelet:`.

    With `pod_resources_socket` it serves PodResourcesLister v1 there, rate limited like the
    kubelet (`pod_resources_rate` = (qps, burst); None: no limit). With `plugins_registry` it
    also registers the device plugins whose sockets appear in that directory (`watch_mode`:
    inotify, polling, or "auto" for inotify when available).

    `versions`: the device plugin API versions it speaks (kept newest first in `self.versions`).
    kubelet.sock serves the Registration service of each, and only those: a Register on another
    version's service gets UNIMPLEMENTED from gRPC, as from a kubelet that never heard of it.

    `profile`: the kubelet release it behaves like (profiles.py: "1.24", "1.25-1.32", "1.33+",
    "next"); the default, "next", is the newest behaviour. `on_register(request, received_at)` is
    awaited as each Register arrives on kubelet.sock, before the kubelet acts on it (a checker's
    chance to look at the plugin at that instant).
    """

    def __init__(
        self,
        plugin_dir: Path,
        *,
        dial_timeout_s: float = 10.0,
        rpc_timeout_s: float = 10.0,
        pod_resources_socket: Path | None = None,
        pod_resources_rate: tuple[float, int] | None = (DEFAULT_QPS, DEFAULT_BURST),
        plugins_registry: Path | None = None,
        watch_mode: WatchMode = "auto",
        versions: Sequence[str] = ("v1beta1",),
        profile: str = "next",
        on_register: Callable[[RegisterRequest, float], Awaitable[None]] | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.versions = newest_first(versions)
        self.profile: Profile = profile_named(profile)
        self.on_register = on_register
        self.dial_timeout_s = dial_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.pod_resources_socket = pod_resources_socket
        self.plugins_registry = plugins_registry
        self.watch_mode: WatchMode = watch_mode
        self.registrations: list[RegistrationRecord] = []
        self.notifications: list[Notification] = []
        self.restarts: list[float] = []
        # A <= 1.24 kubelet's background dials that failed after Register had answered OK.
        self.connect_failures: list[str] = []
        self._sessions: dict[str, PluginSession] = {}
        # Replaced sessions a >= 1.25 kubelet leaves running, and background work to cancel at stop.
        self._replaced: list[PluginSession] = []
        self._background: set[asyncio.Task[None]] = set()
        # manager.go allocatedDevices: per resource, shared by its sessions, kept across restarts.
        self._allocated: dict[str, set[str]] = {}
        self._pods = PodTable(lambda: self._sessions, pod_resources_rate)
        self._server: grpc.aio.Server | None = None
        self._pod_resources_server: grpc.aio.Server | None = None
        self._watcher: PluginWatcher | None = None
        self._changed = asyncio.Condition()

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    @property
    def running(self) -> bool:
        return self._server is not None

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> float:
        """Serve Registration on kubelet.sock; return time.monotonic() once the socket exists."""
        if self._server is not None:
            raise RuntimeError("the fake kubelet is already running")
        # server.go Start: create the directory, then listen (removing a stale kubelet.sock).
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.kubelet_socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        for version in self.versions:
            handler = functools.partial(self._register, version)
            WIRES[version].add_registration_service(server, handler)
        server.add_insecure_port(f"unix:{self.kubelet_socket}")  # creates the socket file
        created_at = time.monotonic()
        await server.start()
        self._server = server
        if self.profile.deprecation_file:
            (self.plugin_dir / DEPRECATION_FILE).touch()
        if self.pod_resources_socket is not None:
            self._pods.restarted()
            self._pod_resources_server = await podresources.serve(self.pod_resources_socket, self._pods)
        if self.plugins_registry is not None:
            registrar = Registrar(
                self.plugins_registry,
                versions=self.versions,
                attach=self._attach,
                record=self._record,
                notifications=self.notifications,
                changed=self._notify,
                dial_timeout_s=self.dial_timeout_s,
            )
            self._watcher = PluginWatcher(
                self.plugins_registry, registrar.register, registrar.unregister, self.watch_mode
            )
            self._watcher.start()
        return created_at

    async def stop(self) -> None:
        """Stop like a dying kubelet: every plugin's stream ends and Registration goes away.

        server.go Stop disconnects every client first (closing its channel, which ends the
        plugin's ListAndWatch stream), then stops the gRPC server without grace.
        """
        server, self._server = self._server, None
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            await watcher.stop()  # no plugin operation may outlive the kubelet
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        sessions, self._sessions = [*self._sessions.values(), *self._replaced], {}
        self._replaced = []
        for session in sessions:
            await session.close()
        if server is not None:
            await server.stop(0)
        pod_resources, self._pod_resources_server = self._pod_resources_server, None
        if pod_resources is not None:
            await pod_resources.stop(0)

    async def restart(
        self,
        cleanup: CleanupMode | None = None,
        versions: Sequence[str] | None = None,
        *,
        profile: str | None = None,
    ) -> float:
        """Restart as a kubelet process would; return when kubelet.sock was re-created.

        `profile`: the new kubelet's release (default: the same); `cleanup`: its directory
        cleanup (default: the new profile's).
        A new kubelet knows no plugins: each must notice (kubelet.sock re-created, its own socket
        removed) and register again. With `versions` the new kubelet speaks those: an upgrade
        (say to v1beta1 and v1beta2) or a downgrade. The cleanup is that of the chosen release
        (dirs.py); it never touches plugins_registry, whose sockets the new kubelet finds and
        registers by itself. Running pods keep running and keep their devices (the kubelet's
        checkpoint).
        """
        new_versions = self.versions if versions is None else newest_first(versions)
        new_profile = self.profile if profile is None else profile_named(profile)
        await self.stop()
        self.versions = new_versions
        self.profile = new_profile
        # server.go Start runs the handler's CleanupPluginDirectory before it listens.
        clean_plugin_dir(self.plugin_dir, cleanup or new_profile.cleanup)
        created_at = await self.start()
        self.restarts.append(created_at)
        return created_at

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- registration ----------------------------------------------------------------------------

    async def _register(self, service_version: str, request: RegisterRequest, received_at: float) -> None:
        """One Register on the Registration service of `service_version`, recorded."""
        error: str | None = "interrupted"
        try:
            if self.on_register is not None:
                await self.on_register(request, received_at)
            socket_path = check_register(request, service_version, self.plugin_dir)
            if self.profile.register_dials:
                await self._attach(request.resource_name, request.endpoint, socket_path, service_version)
            else:
                self._spawn(self._attach_later(request, socket_path, service_version))
        except RegistrationRejected as err:
            error = str(err)
            raise
        except asyncio.CancelledError:
            error = "interrupted: the kubelet stopped during Register"
            raise
        except Exception as err:
            error = f"fake kubelet failed: {err!r}"
            raise
        else:
            error = None
        finally:
            record = RegistrationRecord(
                request.resource_name, request.endpoint, request.version, request.options, received_at, error
            )
            await self._record(record)

    async def _record(self, record: RegistrationRecord) -> None:
        self.registrations.append(record)
        await self._notify()

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _attach_later(self, request: RegisterRequest, socket_path: Path, version: str) -> None:
        """<= 1.24's `go m.addEndpoint(r)`: dial after Register answered; a failure is only logged."""
        try:
            await self._attach(
                request.resource_name,
                request.endpoint,
                socket_path,
                version,
                request.options or PluginOptions(),
            )
        except RegistrationRejected as err:
            self.connect_failures.append(f"{request.resource_name}: {err}")
        await self._notify()  # a session or a failure: either is news to wait_until

    async def _attach(
        self,
        resource: str,
        endpoint: str,
        socket_path: Path,
        version: str,
        options: PluginOptions | None = None,
    ) -> PluginSession:
        """Connect the DevicePlugin at `socket_path` and make it the resource's session."""
        # handler.go connectClient: since 1.25 the kubelet dials and asks for the options inside
        # Register, so a plugin that is not serving yet fails to register.
        client = WIRES[version].client(socket_path)
        allocated = self._allocated.setdefault(resource, set())
        try:
            session = await connect_session(
                resource,
                endpoint,
                client,
                version,
                self.dial_timeout_s,
                self.rpc_timeout_s,
                allocated,
                options,
            )
        except BaseException:
            await client.close()
            raise
        # manager.go PluginConnected replaces the endpoint of a re-registering resource.
        old = self._sessions.get(resource)
        self._sessions[resource] = session  # from here on, stop() closes it
        if self.profile.old_stream_end_disconnects_by_name:
            # handler.go registerClient only replaces the map entry, so a replaced client runs on;
            # when any client's stream ends, runClient disconnects whatever is registered by that
            # name at that moment.
            self._spawn(self._disconnect_by_name_when_ended(resource, session))
            if old is not None:
                self._replaced.append(old)
        elif old is not None:
            # Closing the old connection is the fake's choice: its stream then ends at once, as it
            # would when the old plugin process has gone away.
            await old.close()
        if not self.running or self._sessions.get(resource) is not session:
            await session.close()
            why = "the kubelet stopped" if not self.running else "a newer Register replaced it"
            raise RegistrationRejected(f"{why} during Register")
        session.start()
        return session

    async def _disconnect_by_name_when_ended(self, resource: str, ended: PluginSession) -> None:
        await ended.stream_ended.wait()
        current = self._sessions.get(resource)
        if current is None or current is ended:
            return  # the fake keeps an ended session visible, as before profiles existed
        del self._sessions[resource]
        await current.close(
            "closed by the kubelet: the replaced registration's stream ended and the kubelet "
            "disconnected the resource by name (kubernetes #121994)"
        )
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- what the tests ask ----------------------------------------------------------------------

    def plugin(self, resource: str) -> PluginSession:
        """The current session of `resource`; KeyError when it has not registered (since start)."""
        try:
            return self._sessions[resource]
        except KeyError:
            known = sorted(self._sessions)
            raise KeyError(
                f"no plugin registered for {resource!r} with this kubelet; registered: {known}"
            ) from None

    async def wait_for_plugin(self, resource: str, timeout: float = 10.0) -> PluginSession:
        """The session of `resource`, waiting until it registers."""
        await self.wait_until(
            lambda: resource in self._sessions, timeout=timeout, what=f"plugin {resource!r}"
        )
        return self._sessions[resource]

    async def wait_for_registration(
        self, resource: str, *, count: int = 1, timeout: float = 10.0
    ) -> RegistrationRecord:
        """The latest successful registration of `resource`, once there have been `count`."""

        def successes() -> list[RegistrationRecord]:
            return [r for r in self.registrations if r.resource_name == resource and r.ok]

        await self.wait_until(
            lambda: len(successes()) >= count, timeout=timeout, what=f"{count} registrations of {resource!r}"
        )
        return successes()[-1]

    # -- pods ----------------------------------------------------------------------------------------

    async def run_pod(
        self, namespace: str, name: str, containers: Sequence[ContainerSpec]
    ) -> dict[str, list[str]]:
        """Admit and start a pod, allocating its containers' devices; container name -> device ids."""
        return await self._pods.run(namespace, name, containers)

    async def end_pod(self, namespace: str, name: str) -> None:
        """The pod terminated: it leaves PodResources and its devices are free again; a v1beta2
        plugin gets PostStopContainer and Deallocate first where it asks for them (pods.py)."""
        await self._pods.end(namespace, name)

    @property
    def pods(self) -> list[RunningPod]:
        return self._pods.pods

    @property
    def pod_resources_calls(self) -> int:
        """PodResources calls received (List, Get, GetAllocatableResources), rejected ones included."""
        return self._pods.calls

    async def wait_until(self, ready: Callable[[], bool], *, timeout: float = 10.0, what: str = "") -> None:
        """Wait until `ready()`, checked whenever a registration or a notification is recorded."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(ready)
            except TimeoutError:
                raise TimeoutError(
                    f"no {what or 'such state'} within {timeout}s; registrations seen: {self.registrations}"
                ) from None

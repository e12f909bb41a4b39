"""A fake kubelet device manager: serves Registration and drives registered plugins.

It behaves like pkg/kubelet/cm/devicemanager (manager.go, plugin/v1beta1/{server,handler,
client}.go) of kubelets >= 1.25, over real unix sockets, so a device plugin (the shim, an
adapter) can be tested without a node. It records what it saw as version-neutral records.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import grpc

from . import v1beta1
from .api import ClientFactory, PluginClient
from .dirs import CleanupMode, clean_plugin_dir
from .errors import RegistrationRejected
from .names import is_extended_resource_name
from .records import RegisterRequest, RegistrationRecord
from .session import PluginSession

KUBELET_SOCKET = "kubelet.sock"  # k8s.io/kubelet deviceplugin/v1beta1 constants.go KubeletSocket

# The API versions this kubelet accepts in Register, and the client it then uses for each.
_CLIENTS: dict[str, ClientFactory] = {v1beta1.VERSION: v1beta1.PluginClientV1Beta1}


class FakeKubelet:
    """The kubelet's device manager, faked. Use `async with FakeKubelet(dir) as kubelet:`."""

    def __init__(
        self, plugin_dir: Path, *, dial_timeout_s: float = 10.0, rpc_timeout_s: float = 10.0
    ) -> None:
        self.plugin_dir = plugin_dir
        self.dial_timeout_s = dial_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.registrations: list[RegistrationRecord] = []
        self.restarts: list[float] = []
        self._sessions: dict[str, PluginSession] = {}
        self._server: grpc.aio.Server | None = None
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
        v1beta1.add_registration_service(server, self._register)
        server.add_insecure_port(f"unix:{self.kubelet_socket}")  # creates the socket file
        created_at = time.monotonic()
        await server.start()
        self._server = server
        return created_at

    async def stop(self) -> None:
        """Stop like a dying kubelet: every plugin's stream ends and Registration goes away.

        server.go Stop disconnects every client first (closing its channel, which ends the
        plugin's ListAndWatch stream), then stops the gRPC server without grace.
        """
        server, self._server = self._server, None
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()
        if server is not None:
            await server.stop(0)

    async def restart(self, cleanup: CleanupMode) -> float:
        """Restart as a kubelet process would; return when kubelet.sock was re-created.

        A new kubelet knows no plugins: each must notice (kubelet.sock re-created, its own socket
        removed) and register again. The cleanup is that of the chosen release (dirs.py).
        """
        await self.stop()
        # server.go Start runs the handler's CleanupPluginDirectory before it listens.
        clean_plugin_dir(self.plugin_dir, cleanup)
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

    async def _register(self, request: RegisterRequest, received_at: float) -> None:
        error: str | None = "interrupted"
        try:
            await self._accept(request)
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
            self.registrations.append(record)
            await self._notify()

    async def _accept(self, request: RegisterRequest) -> None:
        # server.go Register: version first, then the resource name, then connect.
        if request.version not in _CLIENTS:
            raise RegistrationRejected(
                f"requested API version {json.dumps(request.version)} is not supported by kubelet. "
                f"Supported versions are {json.dumps(sorted(_CLIENTS))}"
            )
        if not is_extended_resource_name(request.resource_name):
            raise RegistrationRejected(f"the ResourceName {json.dumps(request.resource_name)} is invalid")
        # handler.go connectClient: since 1.25 the kubelet dials and asks for the options inside
        # Register, so a plugin that is not serving yet fails to register.
        client = _CLIENTS[request.version](self._endpoint_path(request.endpoint))
        try:
            session = await self._connect(request, client)
        except BaseException:
            await client.close()
            raise
        # manager.go PluginConnected replaces the endpoint of a re-registering resource. Closing
        # the old connection first is the fake's choice: its stream then ends at once, as it
        # would when the old plugin process has gone away.
        old = self._sessions.get(request.resource_name)
        self._sessions[request.resource_name] = session  # from here on, stop() closes it
        if old is not None:
            await old.close()
        if not self.running or self._sessions.get(request.resource_name) is not session:
            await session.close()
            why = "the kubelet stopped" if not self.running else "a newer Register replaced it"
            raise RegistrationRejected(f"{why} during Register")
        session.start()

    def _endpoint_path(self, endpoint: str) -> Path:
        # server.go Register: filepath.Join(socketDir, endpoint), which joins and cleans even an
        # absolute endpoint (pathlib's `/` would replace the directory instead).
        return Path(os.path.normpath(f"{self.plugin_dir}/{endpoint}"))

    async def _connect(self, request: RegisterRequest, client: PluginClient) -> PluginSession:
        socket_path = self._endpoint_path(request.endpoint)
        try:
            # client.go dial: a blocking dial bounded by a 10 s timeout.
            await asyncio.wait_for(client.connect(), self.dial_timeout_s)
        except TimeoutError:
            raise RegistrationRejected(
                f"failed to dial device plugin: nothing answered on {socket_path} "
                f"within {self.dial_timeout_s}s"
            ) from None
        try:
            options = await client.get_options(self.rpc_timeout_s)
        except grpc.aio.AioRpcError as err:
            # manager.go PluginConnected
            raise RegistrationRejected(
                f"failed to get device plugin options: {err.code().name}: {err.details()}"
            ) from None
        return PluginSession(
            request.resource_name, request.endpoint, options, client, rpc_timeout_s=self.rpc_timeout_s
        )

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
        await self._wait(lambda: resource in self._sessions, timeout, f"plugin {resource!r}")
        return self._sessions[resource]

    async def wait_for_registration(
        self, resource: str, *, count: int = 1, timeout: float = 10.0
    ) -> RegistrationRecord:
        """The latest successful registration of `resource`, once there have been `count`."""

        def successes() -> list[RegistrationRecord]:
            return [r for r in self.registrations if r.resource_name == resource and r.ok]

        await self._wait(lambda: len(successes()) >= count, timeout, f"{count} registrations of {resource!r}")
        return successes()[-1]

    async def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"no {what} within {timeout}s; registrations seen: {self.registrations}"
                ) from None

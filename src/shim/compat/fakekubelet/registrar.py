"""Registering a device plugin found by the plugin watcher, and deregistering it when it goes.

The register operation is pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go
GenerateRegisterPluginFunc with the device manager as the handler of type "DevicePlugin"
(pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go ValidatePlugin, RegisterPlugin,
DeRegisterPlugin). Every message a plugin is sent is built as upstream builds it. Where the fake
speaks several API versions, it uses the newest one the plugin supports (versions.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from .errors import FakeKubeletError
from .gotext import go_quote, go_rpc_error, go_strings
from .names import is_extended_resource_name
from .pluginregistration import DEVICE_PLUGIN, RegistrationClient
from .records import WATCHER, Notification, PluginInfo, RegistrationRecord
from .session import PluginSession
from .versions import newest_common
from .watcher import Outcome

GET_INFO_TIMEOUT_S = 1.0  # operation_generator.go: context.WithTimeout(ctx, time.Second) for GetInfo
NOTIFY_TIMEOUT_S = 5.0  # operation_generator.go notifyTimeoutDuration

Attach = Callable[[str, str, Path, str], Awaitable[PluginSession]]
"""Connects a DevicePlugin and makes it the resource's session: (resource, endpoint, socket, version)."""


@dataclass
class _Attempt:
    """What one register operation learnt, for its RegistrationRecord."""

    socket: Path
    received_at: float
    info: PluginInfo | None = None
    endpoint: str = ""
    version: str = ""
    error: str | None = "interrupted"


class Registrar:
    """The register and unregister operations of the plugin watcher for one kubelet run.

    `versions`: the API versions the kubelet speaks, newest first.
    """

    def __init__(
        self,
        directory: Path,
        *,
        versions: Sequence[str],
        attach: Attach,
        record: Callable[[RegistrationRecord], Awaitable[None]],
        notifications: list[Notification],
        changed: Callable[[], Awaitable[None]],
        dial_timeout_s: float,
    ) -> None:
        self.directory = directory
        self.versions = tuple(versions)
        self._attach = attach
        self._record = record
        self._notifications = notifications
        self._changed = changed
        self._dial_timeout_s = dial_timeout_s
        self._sessions: dict[Path, PluginSession] = {}

    async def register(self, socket: Path) -> Outcome:
        attempt = _Attempt(socket, time.monotonic())
        client = RegistrationClient(socket)
        try:
            outcome = await self._register(attempt, client)
        except asyncio.CancelledError:
            if attempt.error is not None:  # else the plugin was registered; only the notice was cut
                attempt.error = "interrupted: the kubelet stopped during registration"
            raise
        except Exception as err:  # a bug of the fake: recorded, never lost in a background task
            attempt.error = f"fake kubelet failed: {err!r}"
            outcome = Outcome(added=False, failed=True)
        finally:
            await client.close()
            info = attempt.info
            await self._record(
                RegistrationRecord(
                    info.name if info else "",
                    attempt.endpoint,
                    attempt.version,
                    None,
                    attempt.received_at,
                    attempt.error,
                    path=WATCHER,
                    socket=str(socket),
                )
            )
        return outcome

    async def _register(self, attempt: _Attempt, client: RegistrationClient) -> Outcome:
        socket = attempt.socket
        try:
            async with asyncio.timeout(self._dial_timeout_s):
                await client.connect()
        except TimeoutError:
            attempt.error = (
                f"RegisterPlugin error -- dial failed at socket {socket}, "
                f"err: failed to dial socket {socket}, err: context deadline exceeded"
            )
            return Outcome(added=False, failed=True)
        try:
            info = attempt.info = await client.get_info(GET_INFO_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            attempt.error = (
                f"RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {socket}, "
                f"err: {go_rpc_error(err)}"
            )
            return Outcome(added=False, failed=True)
        attempt.version = ",".join(info.supported_versions)
        if info.type != DEVICE_PLUGIN:
            # The fake kubelet only has the device manager's handler; a real one also handles
            # CSIPlugin and DRAPlugin.
            attempt.error = await self._refuse(
                client, socket, f"no handler registered for plugin type: {info.type} at socket {socket}"
            )
            return Outcome(added=False, failed=True)
        # operation_generator.go: an empty endpoint means the registration socket itself; any other
        # value is handed to the handler as is, and client.go dials it as a path.
        attempt.endpoint = info.endpoint or str(socket)
        version = newest_common(self.versions, info.supported_versions)
        invalid = self._validate(info, version)
        if version is None or invalid is not None:
            attempt.error = await self._refuse(
                client, socket, f"plugin validation failed with err: {invalid}"
            )
            return Outcome(added=False, failed=True)
        attempt.version = version
        # AddPlugin to the actual state of the world comes before handler.RegisterPlugin.
        try:
            session = await self._attach(info.name, attempt.endpoint, Path(attempt.endpoint), version)
        except FakeKubeletError as err:
            message = f"RegisterPlugin error -- plugin registration failed with err: {err}"
            undelivered = await self._notify(client, socket, False, message)
            # notifyPlugin's own error is the operation's: the message, plus why it was not sent.
            attempt.error = message if undelivered is None else f"{message}: {undelivered}"
            return Outcome(added=True, failed=True)
        self._sessions[socket] = session
        attempt.error = None  # the device manager has the plugin, whatever becomes of the notification
        undelivered = await self._notify(client, socket, True, "")
        return Outcome(added=True, failed=undelivered is not None)

    async def _refuse(self, client: RegistrationClient, socket: Path, why: str) -> str:
        """Tell the plugin it was refused; the operation's error text."""
        message = f"RegisterPlugin error -- {why}"
        undelivered = await self._notify(client, socket, False, message)
        if undelivered is None:
            return message
        return (
            f"RegisterPlugin error -- failed to send error at socket {socket}, err: {message}: {undelivered}"
        )

    def _validate(self, info: PluginInfo, version: str | None) -> str | None:
        # handler.go ValidatePlugin: the versions first, then the name. Upstream names its only
        # version (api.Version); a kubelet speaking several names the newest.
        if version is None:
            return (
                f"manager version, {self.versions[0]}, is not among plugin supported versions "
                f"{go_strings(info.supported_versions)}"
            )
        if not is_extended_resource_name(info.name):
            # errInvalidResourceName (plugin/v1beta1/api.go), wrapped by ValidatePlugin.
            return f"invalid name of device plugin socket: the ResourceName {go_quote(info.name)} is invalid"
        return None

    async def _notify(
        self, client: RegistrationClient, socket: Path, registered: bool, error: str
    ) -> str | None:
        """Send NotifyRegistrationStatus (notifyPlugin); None once delivered, else the RPC's error."""
        self._notifications.append(Notification(str(socket.relative_to(self.directory)), registered, error))
        await self._changed()
        try:
            await client.notify(registered, error, NOTIFY_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            return go_rpc_error(err)
        return None

    async def unregister(self, socket: Path) -> None:
        # handler.go DeRegisterPlugin: disconnect the client of that socket (its stream ends and
        # manager.go PluginDisconnected marks the devices unhealthy); the resource stays known.
        session = self._sessions.pop(socket, None)
        if session is not None:
            await session.close()

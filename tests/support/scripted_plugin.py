"""TEST DOUBLE: a scripted device plugin on the wire, for the fake kubelet's own tests only.

It serves a PluginScript (scripted.py) as the DevicePlugin service of v1beta1, v1beta2 or both on
one unix socket, and registers on the Registration service of a chosen version. The plugins under
test are the shim and the adapters; this only tests the kubelet side. Like the fake kubelet's
wire.py it works on the generated modules a version module hands out (versions.WIRES); only its
Registration service (at the end) imports pluginregistration's stubs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, TypeVar

import grpc

from shim.compat.fakekubelet.pluginregistration import info_to_proto
from shim.compat.fakekubelet.versions import WIRES, newest_first
from shim.compat.fakekubelet.wire import (
    Context,
    devices_to_proto,
    grant_to_proto,
    options_to_proto,
    preferred_request_from_proto,
)
from shim.generated.pluginregistration.v1 import api_pb2, api_pb2_grpc

from .scripted import PluginScript, RegistrationScript, ScriptedFailure

T = TypeVar("T")


async def _answer(context: Context, reply: Callable[[], T]) -> T:
    """The script's reply, or the RPC aborted with the status of its ScriptedFailure."""
    try:
        return reply()
    except ScriptedFailure as failure:
        await context.abort(failure.code, failure.details)


class _ScriptedServicer:
    """One version's DevicePlugin service over the script; gRPC finds the methods by name, so a
    v1beta1 server simply never routes Deallocate or PostStopContainer here."""

    def __init__(self, pb: ModuleType, script: PluginScript) -> None:
        self._pb = pb
        self._script = script

    async def GetDevicePluginOptions(self, request: Any, context: Context) -> Any:
        return options_to_proto(self._pb, self._script.options)

    async def ListAndWatch(self, request: Any, context: Context) -> AsyncIterator[Any]:
        try:
            async for devices in self._script.watch():
                yield devices_to_proto(self._pb, devices)
        except ScriptedFailure as failure:
            await context.abort(failure.code, failure.details)

    async def GetPreferredAllocation(self, request: Any, context: Context) -> Any:
        requests = preferred_request_from_proto(request)
        answers = await _answer(context, lambda: self._script.preferred(requests))
        responses = [self._pb.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in answers]
        return self._pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: Any, context: Context) -> Any:
        containers = [tuple(r.devices_ids) for r in request.container_requests]
        grants = await _answer(context, lambda: self._script.allocate(containers))
        return self._pb.AllocateResponse(container_responses=[grant_to_proto(self._pb, g) for g in grants])

    async def PreStartContainer(self, request: Any, context: Context) -> Any:
        await _answer(context, lambda: self._script.prestart(tuple(request.devices_ids)))
        return self._pb.PreStartContainerResponse()

    async def Deallocate(self, request: Any, context: Context) -> Any:
        await _answer(context, lambda: self._script.deallocate(tuple(request.devices_ids)))
        return self._pb.DeallocateResponse()

    async def PostStopContainer(self, request: Any, context: Context) -> Any:
        await _answer(context, lambda: self._script.post_stop(tuple(request.devices_ids)))
        return self._pb.PostStopContainerResponse()


class ScriptedPlugin:
    """TEST DOUBLE: a minimal device plugin serving a PluginScript on a unix socket.

    `serves`: the API versions whose DevicePlugin service it offers (all on the same socket, from
    the same script). With a `registration` script it also serves pluginregistration.Registration
    on that socket, as a plugin found by the kubelet's plugin watcher does.
    """

    def __init__(
        self,
        socket_path: Path,
        script: PluginScript | None = None,
        *,
        registration: RegistrationScript | None = None,
        serves: Sequence[str] = ("v1beta1",),
    ) -> None:
        self.socket_path = socket_path
        self.script = script or PluginScript()
        self.registration = registration
        self.serves = newest_first(serves)
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        for version in self.serves:
            wire = WIRES[version]
            servicer = _ScriptedServicer(wire.pb, self.script)
            wire.pb_grpc.add_DevicePluginServicer_to_server(servicer, self._server)
        if self.registration is not None:
            add_scripted_registration(self._server, self.registration)
        self._server.add_insecure_port(f"unix:{self.socket_path}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0)

    async def register(
        self,
        kubelet_socket: Path,
        resource_name: str,
        *,
        on: str | None = None,
        version: str | None = None,
        endpoint: str | None = None,
        timeout: float = 15.0,
    ) -> None:
        """Send Register to the kubelet; raises grpc.aio.AioRpcError when it is refused.

        `on`: the API version whose Registration service is called (default: the newest one the
        plugin serves; any known version may be named); `version`: the request's version field
        (default: `on`).
        """
        wire = WIRES[on or self.serves[0]]
        request = wire.pb.RegisterRequest(
            version=wire.version if version is None else version,
            endpoint=self.socket_path.name if endpoint is None else endpoint,
            resource_name=resource_name,
            options=options_to_proto(wire.pb, self.script.options),
        )
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            await wire.pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout)

    async def __aenter__(self) -> ScriptedPlugin:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


# -- its Registration service (pluginregistration v1) --------------------------------------------

_RegistrationContext = grpc.aio.ServicerContext[Any, Any]


class _ScriptedRegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(self, script: RegistrationScript) -> None:
        self._script = script

    async def GetInfo(
        self, request: api_pb2.InfoRequest, context: _RegistrationContext
    ) -> api_pb2.PluginInfo:
        try:
            info = await self._script.get_info()
        except ScriptedFailure as failure:
            await context.abort(failure.code, failure.details)
        return info_to_proto(info)

    async def NotifyRegistrationStatus(
        self, request: api_pb2.RegistrationStatus, context: _RegistrationContext
    ) -> api_pb2.RegistrationStatusResponse:
        await self._script.notified(request.plugin_registered, request.error)
        return api_pb2.RegistrationStatusResponse()


def add_scripted_registration(server: grpc.aio.Server, script: RegistrationScript) -> None:
    """TEST DOUBLE: serve pluginregistration.Registration from `script` on `server`."""
    servicer = _ScriptedRegistrationServicer(script)
    api_pb2_grpc.add_RegistrationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]

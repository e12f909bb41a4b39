"""The fake kubelet's v1beta1 wire: the only module of it that imports the v1beta1 stubs.

It holds the pure translations between v1beta1 messages and records.py, the Registration service
the kubelet serves, the client the kubelet uses to call a registered plugin, and (at the end,
clearly apart) ScriptedPlugin, a test double used only by the fake kubelet's own tests.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from shim.generated.v1beta1 import api_pb2, api_pb2_grpc

from .api import PreferredRequest, RegisterHandler
from .errors import RegistrationRejected
from .pluginregistration import add_scripted_registration
from .records import DeviceState, Grant, PluginOptions, RegisterRequest
from .scripted import PluginScript, RegistrationScript, ScriptedFailure

VERSION = "v1beta1"

# client.go dial: the kubelet dials with authority "localhost" over the unix socket. Each Go
# ClientConn has its own subchannels; a private pool keeps a new channel from inheriting the
# reconnect backoff of an old one to the same (re-created) socket.
_CHANNEL_OPTIONS = (("grpc.default_authority", "localhost"), ("grpc.use_local_subchannel_pool", 1))

_Context = grpc.aio.ServicerContext[Any, Any]

# -- translation (pure) ---------------------------------------------------------------------------


def options_from_proto(message: api_pb2.DevicePluginOptions) -> PluginOptions:
    return PluginOptions(message.pre_start_required, message.get_preferred_allocation_available)


def options_to_proto(options: PluginOptions) -> api_pb2.DevicePluginOptions:
    return api_pb2.DevicePluginOptions(
        pre_start_required=options.pre_start_required,
        get_preferred_allocation_available=options.get_preferred_allocation_available,
    )


def register_request_from_proto(request: api_pb2.RegisterRequest) -> RegisterRequest:
    options = options_from_proto(request.options) if request.HasField("options") else None
    return RegisterRequest(request.version, request.endpoint, request.resource_name, options)


def devices_from_proto(response: api_pb2.ListAndWatchResponse) -> tuple[DeviceState, ...]:
    return tuple(
        DeviceState(device.ID, device.health, tuple(node.ID for node in device.topology.nodes))
        for device in response.devices
    )


def devices_to_proto(devices: Sequence[DeviceState]) -> api_pb2.ListAndWatchResponse:
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(
                ID=device.id,
                health=device.health,
                # An absent topology means "no NUMA affinity" (manager.go filterByAffinity).
                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in device.numa_nodes])
                if device.numa_nodes
                else None,
            )
            for device in devices
        ]
    )


def grant_from_proto(response: api_pb2.ContainerAllocateResponse) -> Grant:
    return Grant(
        envs=dict(response.envs),
        mounts=tuple((m.container_path, m.host_path, m.read_only) for m in response.mounts),
        device_nodes=tuple((d.container_path, d.host_path, d.permissions) for d in response.devices),
        annotations=dict(response.annotations),
        cdi_devices=tuple(cdi.name for cdi in response.cdi_devices),
    )


def grant_to_proto(grant: Grant) -> api_pb2.ContainerAllocateResponse:
    return api_pb2.ContainerAllocateResponse(
        envs=grant.envs,
        mounts=[api_pb2.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in grant.mounts],
        devices=[
            api_pb2.DeviceSpec(container_path=c, host_path=h, permissions=p) for c, h, p in grant.device_nodes
        ],
        annotations=grant.annotations,
        cdi_devices=[api_pb2.CDIDevice(name=name) for name in grant.cdi_devices],
    )


# -- the kubelet side -----------------------------------------------------------------------------


class _RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    def __init__(self, handler: RegisterHandler) -> None:
        self._handler = handler

    async def Register(self, request: api_pb2.RegisterRequest, context: _Context) -> api_pb2.Empty:
        received_at = time.monotonic()
        try:
            await self._handler(register_request_from_proto(request), received_at)
        except RegistrationRejected as err:
            # server.go Register returns a plain Go error, which grpc-go sends as status Unknown.
            await context.abort(grpc.StatusCode.UNKNOWN, str(err))
        return api_pb2.Empty()


def add_registration_service(server: grpc.aio.Server, handler: RegisterHandler) -> None:
    """Serve v1beta1.Registration on `server`, passing every Register call to `handler`."""
    api_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(handler), server)  # type: ignore[no-untyped-call]


class PluginClientV1Beta1:
    """The kubelet's v1beta1 connection to one plugin (client.go + endpoint.go); see api.PluginClient."""

    def __init__(self, socket_path: Path) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix:{socket_path}", options=_CHANNEL_OPTIONS)
        self._stub = api_pb2_grpc.DevicePluginStub(self._channel)  # type: ignore[no-untyped-call]
        self._closed = False

    async def connect(self) -> None:
        # client.go dial uses grpc.WithBlock: the dial only succeeds once the socket answers.
        await self._channel.channel_ready()

    async def get_options(self, timeout: float) -> PluginOptions:
        return options_from_proto(await self._stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout))

    async def list_and_watch(self) -> AsyncIterator[tuple[DeviceState, ...]]:
        # client.go Run: no deadline; the stream lasts as long as the plugin and the channel.
        call = self._stub.ListAndWatch(api_pb2.Empty())
        try:
            async for response in call:
                yield devices_from_proto(response)
        finally:
            call.cancel()

    async def allocate(self, containers: Sequence[Sequence[str]], timeout: float) -> list[Grant]:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
        )
        response = await self._stub.Allocate(request, timeout=timeout)
        return [grant_from_proto(container) for container in response.container_responses]

    async def preferred_allocation(
        self, requests: Sequence[PreferredRequest], timeout: float
    ) -> list[tuple[str, ...]]:
        message = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=r.available,
                    must_include_deviceIDs=r.must_include,
                    allocation_size=r.size,
                )
                for r in requests
            ]
        )
        response = await self._stub.GetPreferredAllocation(message, timeout=timeout)
        return [tuple(container.deviceIDs) for container in response.container_responses]

    async def prestart(self, device_ids: Sequence[str], timeout: float) -> None:
        request = api_pb2.PreStartContainerRequest(devices_ids=device_ids)
        await self._stub.PreStartContainer(request, timeout=timeout)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._channel.close(None)


# -- TEST DOUBLE: a scripted v1beta1 device plugin, for the fake kubelet's own tests only -----------


class _ScriptedServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, script: PluginScript) -> None:
        self._script = script

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: _Context
    ) -> api_pb2.DevicePluginOptions:
        return options_to_proto(self._script.options)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: _Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        try:
            async for devices in self._script.watch():
                yield devices_to_proto(devices)
        except ScriptedFailure as failure:
            await context.abort(failure.code, failure.details)

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: _Context
    ) -> api_pb2.PreferredAllocationResponse:
        requests = [
            PreferredRequest(tuple(r.available_deviceIDs), tuple(r.must_include_deviceIDs), r.allocation_size)
            for r in request.container_requests
        ]
        try:
            answers = self._script.preferred(requests)
        except ScriptedFailure as failure:
            await context.abort(failure.code, failure.details)
        responses = [api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in answers]
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: api_pb2.AllocateRequest, context: _Context) -> api_pb2.AllocateResponse:
        try:
            grants = self._script.allocate([tuple(r.devices_ids) for r in request.container_requests])
        except ScriptedFailure as failure:
            await context.abort(failure.code, failure.details)
        return api_pb2.AllocateResponse(container_responses=[grant_to_proto(grant) for grant in grants])

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: _Context
    ) -> api_pb2.PreStartContainerResponse:
        try:
            self._script.prestart(tuple(request.devices_ids))
        except ScriptedFailure as failure:
            await context.abort(failure.code, failure.details)
        return api_pb2.PreStartContainerResponse()


class ScriptedPlugin:
    """TEST DOUBLE: a minimal v1beta1 device plugin serving a PluginScript on a unix socket.

    Used only to test the fake kubelet itself; the plugins under test are the shim and adapters.
    With a `registration` script it also serves pluginregistration.Registration on the same socket,
    as a plugin found by the kubelet's plugin watcher does.
    """

    def __init__(
        self,
        socket_path: Path,
        script: PluginScript | None = None,
        *,
        registration: RegistrationScript | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.script = script or PluginScript()
        self.registration = registration
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        servicer = _ScriptedServicer(self.script)
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, self._server)  # type: ignore[no-untyped-call]
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
        version: str = VERSION,
        endpoint: str | None = None,
        timeout: float = 15.0,
    ) -> None:
        """Send Register to the kubelet; raises grpc.aio.AioRpcError when it is refused."""
        request = api_pb2.RegisterRequest(
            version=version,
            endpoint=self.socket_path.name if endpoint is None else endpoint,
            resource_name=resource_name,
            options=options_to_proto(self.script.options),
        )
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(request, timeout=timeout)

    async def __aenter__(self) -> ScriptedPlugin:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

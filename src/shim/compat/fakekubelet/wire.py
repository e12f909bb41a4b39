"""What the fake kubelet's device-plugin API versions share on the wire, written once.

v1beta1 and devshim's experimental v1beta2 have messages of the same shape in different protobuf
packages (v1beta2 only adds two options flags and two RPCs). The translations, the Registration
servicer and the plugin client here work on either version's generated modules, which the version
module (v1beta1.py, v1beta2.py: the only importers of those stubs) passes in: duck typing, so no
version is named here. src/shim/deviceplugin/common.py does the same for devshim's serving side.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from .api import ClientFactory, PreferredRequest, RegisterHandler
from .errors import RegistrationRejected
from .records import DeviceState, Grant, PluginOptions, RegisterRequest

# client.go dial: the kubelet dials with authority "localhost" over the unix socket. Each Go
# ClientConn has its own subchannels; a private pool keeps a new channel from inheriting the
# reconnect backoff of an old one to the same (re-created) socket.
CHANNEL_OPTIONS = (("grpc.default_authority", "localhost"), ("grpc.use_local_subchannel_pool", 1))

Context = grpc.aio.ServicerContext[Any, Any]

# PluginOptions' fields are named like DevicePluginOptions' fields, in every version.
_OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(PluginOptions))


@dataclass(frozen=True)
class Wire:
    """One API version as its version module hands it out: its name, its generated modules and
    the kubelet's client class for it."""

    version: str
    pb: ModuleType
    pb_grpc: ModuleType
    client: ClientFactory

    def add_registration_service(self, server: grpc.aio.Server, handler: RegisterHandler) -> None:
        """Serve this version's Registration on `server`, passing every Register to `handler`."""
        servicer = _RegistrationServicer(self.pb, handler)
        self.pb_grpc.add_RegistrationServicer_to_server(servicer, server)


# -- translation (pure) ---------------------------------------------------------------------------


def options_from_proto(message: Any) -> PluginOptions:
    # A flag this version's message lacks (v1beta1 has no v1beta2 flags) stays False.
    present = message.DESCRIPTOR.fields_by_name
    flags = {name: getattr(message, name) for name in _OPTION_FIELDS if name in present}
    return PluginOptions(**flags)


def options_to_proto(pb: ModuleType, options: PluginOptions) -> Any:
    # A flag the version cannot carry is dropped, as a plugin built against it could not send it.
    present = pb.DevicePluginOptions.DESCRIPTOR.fields_by_name
    flags = {name: getattr(options, name) for name in _OPTION_FIELDS if name in present}
    return pb.DevicePluginOptions(**flags)


def register_request_from_proto(request: Any) -> RegisterRequest:
    options = options_from_proto(request.options) if request.HasField("options") else None
    return RegisterRequest(request.version, request.endpoint, request.resource_name, options)


def devices_from_proto(response: Any) -> tuple[DeviceState, ...]:
    return tuple(
        DeviceState(device.ID, device.health, tuple(node.ID for node in device.topology.nodes))
        for device in response.devices
    )


def devices_to_proto(pb: ModuleType, devices: Sequence[DeviceState]) -> Any:
    return pb.ListAndWatchResponse(
        devices=[
            pb.Device(
                ID=device.id,
                health=device.health,
                # An absent topology means "no NUMA affinity" (manager.go filterByAffinity).
                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in device.numa_nodes])
                if device.numa_nodes
                else None,
            )
            for device in devices
        ]
    )


def grant_from_proto(response: Any) -> Grant:
    return Grant(
        envs=dict(response.envs),
        mounts=tuple((m.container_path, m.host_path, m.read_only) for m in response.mounts),
        device_nodes=tuple((d.container_path, d.host_path, d.permissions) for d in response.devices),
        annotations=dict(response.annotations),
        cdi_devices=tuple(cdi.name for cdi in response.cdi_devices),
    )


def grant_to_proto(pb: ModuleType, grant: Grant) -> Any:
    return pb.ContainerAllocateResponse(
        envs=grant.envs,
        mounts=[pb.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in grant.mounts],
        devices=[
            pb.DeviceSpec(container_path=c, host_path=h, permissions=p) for c, h, p in grant.device_nodes
        ],
        annotations=grant.annotations,
        cdi_devices=[pb.CDIDevice(name=name) for name in grant.cdi_devices],
    )


def preferred_request_from_proto(request: Any) -> list[PreferredRequest]:
    return [
        PreferredRequest(tuple(r.available_deviceIDs), tuple(r.must_include_deviceIDs), r.allocation_size)
        for r in request.container_requests
    ]


# -- the kubelet side -----------------------------------------------------------------------------


class _RegistrationServicer:
    """A version's Registration service (server.go); gRPC finds Register by name."""

    def __init__(self, pb: ModuleType, handler: RegisterHandler) -> None:
        self._pb = pb
        self._handler = handler

    async def Register(self, request: Any, context: Context) -> Any:
        received_at = time.monotonic()
        try:
            await self._handler(register_request_from_proto(request), received_at)
        except RegistrationRejected as err:
            # server.go Register returns a plain Go error, which grpc-go sends as status Unknown.
            await context.abort(grpc.StatusCode.UNKNOWN, str(err))
        return self._pb.Empty()


class PluginClientBase:
    """The kubelet's connection to one plugin (client.go + endpoint.go); see api.PluginClient.

    A version module subclasses it, naming its generated modules in `pb` and `pb_grpc`.
    """

    pb: ModuleType  # the version's generated messages
    pb_grpc: ModuleType  # and its services

    def __init__(self, socket_path: Path) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix:{socket_path}", options=CHANNEL_OPTIONS)
        self._stub = self.pb_grpc.DevicePluginStub(self._channel)
        self._closed = False

    async def connect(self) -> None:
        # client.go dial uses grpc.WithBlock: the dial only succeeds once the socket answers.
        await self._channel.channel_ready()

    async def get_options(self, timeout: float) -> PluginOptions:
        return options_from_proto(await self._stub.GetDevicePluginOptions(self.pb.Empty(), timeout=timeout))

    async def list_and_watch(self) -> AsyncIterator[tuple[DeviceState, ...]]:
        # client.go Run: no deadline; the stream lasts as long as the plugin and the channel.
        call = self._stub.ListAndWatch(self.pb.Empty())
        try:
            async for response in call:
                yield devices_from_proto(response)
        finally:
            call.cancel()

    async def allocate(self, containers: Sequence[Sequence[str]], timeout: float) -> list[Grant]:
        pb = self.pb
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
        )
        response = await self._stub.Allocate(request, timeout=timeout)
        return [grant_from_proto(container) for container in response.container_responses]

    async def preferred_allocation(
        self, requests: Sequence[PreferredRequest], timeout: float
    ) -> list[tuple[str, ...]]:
        pb = self.pb
        message = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
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
        request = self.pb.PreStartContainerRequest(devices_ids=device_ids)
        await self._stub.PreStartContainer(request, timeout=timeout)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._channel.close(None)

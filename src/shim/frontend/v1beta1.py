"""The kubelet device-plugin API v1beta1 <-> the neutral model.

The only module in the serving path that imports the v1beta1 stubs (a ruff
banned-import rule keeps it so). Translation functions are pure; the servicer
only translates and delegates to the core's ResourceService.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import grpc
from loguru import logger

from shim.core.resource import ResourceService
from shim.errors import grpc_status
from shim.generated.v1beta1 import api_pb2 as pb
from shim.generated.v1beta1 import api_pb2_grpc as pb_grpc
from shim.model import (
    Capabilities,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    PreferredAllocationRequest,
)

NAME = "v1beta1"
Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = "v1beta1.DevicePlugin"

# --- pure translation ------------------------------------------------------


def options_from_model(caps: Capabilities) -> pb.DevicePluginOptions:
    return pb.DevicePluginOptions(
        pre_start_required=caps.pre_start,
        get_preferred_allocation_available=caps.preferred_allocation,
    )


def device_from_model(device: Device) -> pb.Device:
    message = pb.Device(ID=device.id, health=device.health.value)
    if device.numa_nodes:
        # No topology at all (not an empty one) when NUMA is unknown: the kubelet's
        # topology manager treats a device without topology as fitting any node.
        message.topology.nodes.extend(pb.NUMANode(ID=n) for n in device.numa_nodes)
    return message


def list_from_model(devices: Sequence[Device]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[device_from_model(d) for d in devices])


def allocate_request_to_model(request: pb.AllocateRequest) -> list[ContainerAllocateRequest]:
    return [ContainerAllocateRequest(tuple(c.devices_ids)) for c in request.container_requests]


def grant_from_model(grant: ContainerGrant) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(grant.envs),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in grant.mounts
        ],
        devices=[
            pb.DeviceSpec(container_path=n.container_path, host_path=n.host_path, permissions=n.permissions)
            for n in grant.device_nodes
        ],
        annotations=dict(grant.annotations),
        cdi_devices=[pb.CDIDevice(name=name) for name in grant.cdi_devices],
    )


def preferred_request_to_model(request: pb.PreferredAllocationRequest) -> list[PreferredAllocationRequest]:
    return [
        PreferredAllocationRequest(
            available=tuple(c.available_deviceIDs),
            must_include=tuple(c.must_include_deviceIDs),
            size=c.allocation_size,
        )
        for c in request.container_requests
    ]


def preferred_response_from_model(choices: Sequence[Sequence[str]]) -> pb.PreferredAllocationResponse:
    return pb.PreferredAllocationResponse(
        container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=list(c)) for c in choices]
    )


# --- serving ---------------------------------------------------------------


async def _abort(context: Context, error: Exception) -> NoReturn:
    code, message = grpc_status(error)
    logger.warning("{}", message)
    await context.abort(code, message)
    raise AssertionError("unreachable: abort raises")


class DevicePluginServicer(pb_grpc.DevicePluginServicer):
    def __init__(self, resource: ResourceService, on_stream_end: Callable[[], None]) -> None:
        self._resource = resource
        self._on_stream_end = on_stream_end
        self._retired = False

    def retire(self) -> None:
        """devshim is closing this server: the streams that end now are our doing."""
        self._retired = True

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Context) -> pb.DevicePluginOptions:
        return options_from_model(self._resource.capabilities())

    async def ListAndWatch(
        self, request: pb.Empty, context: Context
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        # Never returns while the plugin means to stay registered: the kubelet
        # takes a returned stream as the plugin going away (devicemanager client.go Run()).
        try:
            async for devices in self._resource.watch():
                yield list_from_model(devices)
        finally:
            if not self._retired:
                # The kubelet ended the stream: it restarted or dropped us. Re-register.
                self._on_stream_end()

    async def Allocate(self, request: pb.AllocateRequest, context: Context) -> pb.AllocateResponse:
        try:
            grants = await self._resource.allocate(allocate_request_to_model(request))
        except Exception as exc:
            await _abort(context, exc)
        return pb.AllocateResponse(container_responses=[grant_from_model(g) for g in grants])

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Context
    ) -> pb.PreferredAllocationResponse:
        try:
            choices = [
                await self._resource.preferred_allocation(r) for r in preferred_request_to_model(request)
            ]
        except Exception as exc:
            await _abort(context, exc)
        return preferred_response_from_model(choices)

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Context
    ) -> pb.PreStartContainerResponse:
        try:
            await self._resource.prestart(tuple(request.devices_ids))
        except Exception as exc:
            await _abort(context, exc)
        return pb.PreStartContainerResponse()


class V1Beta1:
    """This version as the endpoint sees it (shim.frontend.api.ApiVersion)."""

    name = NAME
    service_names: tuple[str, ...] = (SERVICE_NAME,)

    def add_services(
        self, server: grpc.aio.Server, resource: ResourceService, on_stream_end: Callable[[], None]
    ) -> DevicePluginServicer:
        servicer = DevicePluginServicer(resource, on_stream_end)
        pb_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        return servicer

    async def register(
        self, kubelet_socket: Path, endpoint: str, resource: ResourceService, timeout_s: float
    ) -> None:
        request = pb.RegisterRequest(
            version=NAME,
            endpoint=endpoint,
            resource_name=resource.name,
            # Kubelets up to 1.24 kept the options sent here (manager.go registerEndpoint);
            # later ones call GetDevicePluginOptions after dialing (handler.go PluginConnected).
            options=options_from_model(resource.capabilities()),
        )
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(request, timeout=timeout_s)


API = V1Beta1()

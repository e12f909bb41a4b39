"""What every device-plugin API version shares, written once.

v1beta1 and devshim's v1beta2 have messages of the same shape in different
packages. The pure translations and the five common RPCs here work on either
version's generated module, passed in by the version module (the only place a
version's stubs are imported): duck typing, so no version is named here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import grpc
from loguru import logger

from shim.core.api import PluginResource
from shim.deviceplugin import encoded, service
from shim.deviceplugin.api import ListRefused
from shim.errors import ListNotEncodable, ListTooLarge, grpc_status
from shim.model import (
    Capabilities,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    PreferredAllocationRequest,
)
from shim.ops import metrics, rpc

Context = grpc.aio.ServicerContext[Any, Any]

# The largest ListAndWatchResponse the kubelet accepts: it dials plugins without raising gRPC's
# default 4 MiB receive limit (pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go dial passes
# no grpc.MaxCallRecvMsgSize). grpc-go compares the limit with the serialized message alone, the
# length in the 5-byte frame prefix, which does not count the prefix (rpc_util.go recvMsg:
# `if int(length) > maxReceiveMessageSize`), so a message of exactly this size still arrives.
KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# --- pure translation ------------------------------------------------------


def device_from_model(pb: ModuleType, device: Device) -> Any:
    message = pb.Device(ID=device.id, health=device.health.value)
    if device.numa_nodes:
        # No topology at all (not an empty one) when NUMA is unknown: the kubelet's
        # topology manager treats a device without topology as fitting any node.
        message.topology.nodes.extend(pb.NUMANode(ID=n) for n in device.numa_nodes)
    return message


def list_from_model(pb: ModuleType, devices: Sequence[Device]) -> Any:
    return pb.ListAndWatchResponse(devices=[device_from_model(pb, d) for d in devices])


def allocate_request_to_model(request: Any) -> list[ContainerAllocateRequest]:
    return [ContainerAllocateRequest(tuple(c.devices_ids)) for c in request.container_requests]


def grant_from_model(pb: ModuleType, grant: ContainerGrant) -> Any:
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


def preferred_request_to_model(request: Any) -> list[PreferredAllocationRequest]:
    return [
        PreferredAllocationRequest(
            available=tuple(c.available_deviceIDs),
            must_include=tuple(c.must_include_deviceIDs),
            size=c.allocation_size,
        )
        for c in request.container_requests
    ]


def preferred_response_from_model(pb: ModuleType, choices: Sequence[Sequence[str]]) -> Any:
    return pb.PreferredAllocationResponse(
        container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=list(c)) for c in choices]
    )


# --- serving ---------------------------------------------------------------


async def abort(context: Context, error: Exception) -> NoReturn:
    code, message = grpc_status(error)
    logger.warning("{}", message)
    await context.abort(code, message)
    raise AssertionError("unreachable: abort raises")


class CommonServicer:
    """The RPCs every version has; a version module mixes this into its generated servicer."""

    pb: ModuleType  # the version's generated messages
    to_options: Callable[[Capabilities], Any]  # the version's DevicePluginOptions from capabilities

    def __init__(
        self, resource: PluginResource, on_stream_end: Callable[[ListRefused | None], None], version: str
    ) -> None:
        self._resource = resource
        self._version = version
        self._on_stream_end = on_stream_end
        self._retired = False
        self._grants = encoded.GrantEncoder(self.pb, grant_from_model)
        self.calls = service.InFlight()

    def retire(self) -> None:
        """devshim is closing this server: the streams that end now are our doing."""
        self._retired = True

    def calls_in_flight(self) -> list[asyncio.Task[Any]]:
        return self.calls.now()

    async def GetDevicePluginOptions(self, request: Any, context: Context) -> Any:
        return self.options()

    def options(self) -> Any:
        return self.to_options(self._resource.capabilities())

    async def ListAndWatch(self, request: Any, context: Context) -> AsyncIterator[Any]:
        # Never returns while the plugin means to stay registered: the kubelet
        # takes a returned stream as the plugin going away (devicemanager client.go Run()).
        rpc.stream_opened(self._resource.name, self._version, "ListAndWatch")
        refused: ListRefused | None = None
        try:
            encoder = encoded.ListEncoder(self.pb, device_from_model)
            async for devices in self._resource.watch():
                try:
                    message = await encoder.encode_in_slices(devices)
                except Exception as exc:
                    # Never a stream that just ends (the kubelet would only log it, and devshim take
                    # it for the kubelet's doing and register into the same failure): refused as a
                    # list too large is, with the reason as its status. The kubelet then stops
                    # trusting the last list it got, which devshim can no longer update.
                    refused = self._not_encodable(devices, exc)
                    await context.abort(*grpc_status(ListNotEncodable(refused.reason)))
                size = len(message)
                if size > KUBELET_MAX_MESSAGE_BYTES:
                    # Sent anyway, the kubelet's stream would fail with RESOURCE_EXHAUSTED on its
                    # side only and the plugin re-register into the same failure: say it here, once.
                    refused = self._refuse(devices, size)
                    await context.abort(*grpc_status(ListTooLarge(refused.reason)))
                yield message
                metrics.list_sent(self._resource.name, self._version)
        finally:
            if not self._retired:
                # Refused: devshim ended the stream. Otherwise the kubelet did: it restarted or dropped us.
                self._on_stream_end(refused)

    def _refuse(self, devices: tuple[Device, ...], size: int) -> ListRefused:
        metrics.list_too_large(self._resource.name)
        return self._refused(
            devices,
            f"the list of {len(devices)} devices is {size:,} bytes, over the "
            f"kubelet's {KUBELET_MAX_MESSAGE_BYTES:,}-byte gRPC message limit",
        )

    def _not_encodable(self, devices: tuple[Device, ...], error: Exception) -> ListRefused:
        metrics.list_encode_failed(self._resource.name)
        why = error if isinstance(error, encoded.DeviceNotEncodable) else repr(error)
        what = f"the list of {len(devices)} devices"
        return self._refused(devices, f"cannot encode {what} for the kubelet: {why}")

    def _refused(self, devices: tuple[Device, ...], why: str) -> ListRefused:
        reason = f"{self._resource.name}: ListAndWatch: {why}; not sent"
        logger.error("{}", reason)
        return ListRefused(devices, reason)

    async def Allocate(self, request: Any, context: Context) -> bytes:
        try:
            grants = await self._resource.allocate(allocate_request_to_model(request))
        except Exception as exc:
            await abort(context, exc)
        return self._grants.encode(grants)

    async def GetPreferredAllocation(self, request: Any, context: Context) -> Any:
        try:
            choices = [
                await self._resource.preferred_allocation(r) for r in preferred_request_to_model(request)
            ]
        except Exception as exc:
            await abort(context, exc)
        return preferred_response_from_model(self.pb, choices)

    async def PreStartContainer(self, request: Any, context: Context) -> Any:
        try:
            await self._resource.prestart(tuple(request.devices_ids))
        except Exception as exc:
            await abort(context, exc)
        return self.pb.PreStartContainerResponse()


class VersionApi:
    """One version as the endpoint sees it (shim.deviceplugin.api.ApiVersion), built by its module
    from its own generated code: name, servicer class, options translation and stubs."""

    def __init__(
        self,
        name: str,
        pb: ModuleType,
        pb_grpc: ModuleType,
        servicer: type[CommonServicer],
        options: Callable[[Capabilities], Any],
    ) -> None:
        self.name = name
        self.service_names: tuple[str, ...] = (f"{name}.DevicePlugin",)
        self._pb = pb
        self._pb_grpc = pb_grpc
        self._servicer = servicer
        self._options = options

    def add_services(
        self,
        server: grpc.aio.Server,
        resource: PluginResource,
        on_stream_end: Callable[[ListRefused | None], None],
    ) -> CommonServicer:
        servicer = self._servicer(resource, on_stream_end, self.name)
        service.add(server, self._pb, servicer, resource.name, self.name, servicer.calls)
        return servicer

    async def register(
        self, kubelet_socket: Path, endpoint: str, resource: PluginResource, timeout_s: float
    ) -> None:
        """Register on kubelet.sock through this version's Registration service."""
        request = self._pb.RegisterRequest(
            version=self.name,
            endpoint=endpoint,
            resource_name=resource.name,
            # Kubelets up to 1.24 kept the options sent here (manager.go registerEndpoint);
            # later ones call GetDevicePluginOptions after dialing (handler.go PluginConnected).
            options=self._options(resource.capabilities()),
        )
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            await self._pb_grpc.RegistrationStub(channel).Register(request, timeout=timeout_s)

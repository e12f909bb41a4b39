"""devshim's EXPERIMENTAL v1beta2 <-> the neutral model (docs/api-versions.md).

v1beta1's shape plus Deallocate and PostStopContainer (KEP-3162's proposal;
upstream has published no v1beta2). The only serving-path importer of the
v1beta2 stubs; everything shared with v1beta1 is in common.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from shim.core.resource import ResourceService
from shim.frontend import common
from shim.generated.v1beta2 import api_pb2 as pb
from shim.generated.v1beta2 import api_pb2_grpc as pb_grpc
from shim.model import Capabilities

NAME = "v1beta2"
SERVICE_NAME = "v1beta2.DevicePlugin"


def options_from_model(caps: Capabilities) -> pb.DevicePluginOptions:
    return pb.DevicePluginOptions(
        pre_start_required=caps.pre_start,
        get_preferred_allocation_available=caps.preferred_allocation,
        deallocate_available=caps.deallocate,
        post_stop_container_required=caps.post_stop,
    )


class DevicePluginServicer(common.CommonServicer, pb_grpc.DevicePluginServicer):
    pb = pb

    def options(self) -> pb.DevicePluginOptions:
        return options_from_model(self._resource.capabilities())

    async def Deallocate(self, request: pb.DeallocateRequest, context: common.Context) -> Any:
        try:
            await self._resource.deallocate_now(tuple(request.devices_ids))
        except Exception as exc:
            await common.abort(context, exc)
        return pb.DeallocateResponse()

    async def PostStopContainer(self, request: pb.PostStopContainerRequest, context: common.Context) -> Any:
        try:
            await self._resource.post_stop(tuple(request.devices_ids))
        except Exception as exc:
            await common.abort(context, exc)
        return pb.PostStopContainerResponse()


class V1Beta2:
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
        options = options_from_model(resource.capabilities())
        await common.register(
            pb, pb_grpc.RegistrationStub, NAME, kubelet_socket, endpoint, resource, options, timeout_s
        )


API = V1Beta2()

"""The kubelet device-plugin API v1beta1 <-> the neutral model.

The only module in the serving path that imports the v1beta1 stubs (a ruff
banned-import rule keeps it so); what v1beta1 shares with other versions is in
common.py, which works on whichever version's messages it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc

from shim.core.resource import ResourceService
from shim.frontend import common
from shim.generated.v1beta1 import api_pb2 as pb
from shim.generated.v1beta1 import api_pb2_grpc as pb_grpc
from shim.model import Capabilities

NAME = "v1beta1"
SERVICE_NAME = "v1beta1.DevicePlugin"


def options_from_model(caps: Capabilities) -> pb.DevicePluginOptions:
    return pb.DevicePluginOptions(
        pre_start_required=caps.pre_start,
        get_preferred_allocation_available=caps.preferred_allocation,
    )


class DevicePluginServicer(common.CommonServicer, pb_grpc.DevicePluginServicer):
    pb = pb


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
        options = options_from_model(resource.capabilities())
        await common.register(
            pb, pb_grpc.RegistrationStub, NAME, kubelet_socket, endpoint, resource, options, timeout_s
        )


API = V1Beta1()

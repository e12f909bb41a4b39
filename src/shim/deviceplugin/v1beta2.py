"""devshim's EXPERIMENTAL v1beta2 <-> the neutral model (docs/api-versions.md).

v1beta1's shape plus Deallocate and PostStopContainer (KEP-3162's proposal;
upstream has published no v1beta2). The only serving-path importer of the
v1beta2 stubs; everything shared with v1beta1 is in common.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from shim.deviceplugin import common
from shim.generated.v1beta2 import api_pb2 as pb
from shim.generated.v1beta2 import api_pb2_grpc as pb_grpc
from shim.model import Capabilities

NAME = "v1beta2"


def options_from_model(caps: Capabilities) -> pb.DevicePluginOptions:
    return pb.DevicePluginOptions(
        pre_start_required=caps.pre_start,
        get_preferred_allocation_available=caps.preferred_allocation,
        deallocate_available=caps.deallocate,
        post_stop_container_required=caps.post_stop,
    )


class DevicePluginServicer(common.CommonServicer, pb_grpc.DevicePluginServicer):
    pb = pb
    to_options = staticmethod(options_from_model)

    async def Deallocate(self, request: pb.DeallocateRequest, context: common.Context) -> Any:
        await self._on_devices(self._resource.deallocate_now, request.devices_ids, context)
        return pb.DeallocateResponse()

    async def PostStopContainer(self, request: pb.PostStopContainerRequest, context: common.Context) -> Any:
        await self._on_devices(self._resource.post_stop, request.devices_ids, context)
        return pb.PostStopContainerResponse()

    @staticmethod
    async def _on_devices(
        call: Callable[[tuple[str, ...]], Awaitable[None]], device_ids: Iterable[str], context: common.Context
    ) -> None:
        # Both RPCs hand their device IDs to the resource; any error aborts with its gRPC status.
        try:
            await call(tuple(device_ids))
        except Exception as exc:
            await common.abort(context, exc)


API = common.VersionApi(NAME, pb, pb_grpc, DevicePluginServicer, options_from_model)

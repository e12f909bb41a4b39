"""DRAPlugin v1 (k8s.io/kubelet/pkg/apis/dra/v1): the only serving-path importer of its stubs."""

from __future__ import annotations

from typing import Any

import grpc

from shim.dra.plugin.common import DraService
from shim.generated.dra.v1 import api_pb2 as pb
from shim.generated.dra.v1 import api_pb2_grpc as pb_grpc

# What the plugin watcher's supported versions call it; the wire name is the proto's full one.
SERVICE = "v1.DRAPlugin"


class _Servicer(pb_grpc.DRAPluginServicer):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodePrepareResources(
        self, request: pb.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.NodePrepareResourcesResponse:
        answer: pb.NodePrepareResourcesResponse = await self._service.call(
            SERVICE, "NodePrepareResources", pb, request
        )
        return answer

    async def NodeUnprepareResources(
        self, request: pb.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.NodeUnprepareResourcesResponse:
        answer: pb.NodeUnprepareResourcesResponse = await self._service.call(
            SERVICE, "NodeUnprepareResources", pb, request
        )
        return answer


def add(server: grpc.aio.Server, service: DraService) -> str:
    """Serve it on ``server``; its full wire name."""
    pb_grpc.add_DRAPluginServicer_to_server(_Servicer(service), server)  # type: ignore[no-untyped-call]
    return str(pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name)

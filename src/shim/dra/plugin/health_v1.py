"""DRAResourceHealth v1 (k8s.io/kubelet/pkg/apis/dra-health/v1): the only serving-path importer
of its stubs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from shim.dra.plugin.common import DraService
from shim.generated.drahealth.v1 import api_pb2 as pb
from shim.generated.drahealth.v1 import api_pb2_grpc as pb_grpc

SERVICE = "v1.DRAResourceHealth"


class _Servicer(pb_grpc.DRAResourceHealthServicer):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodeWatchResources(
        self, request: pb.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.NodeWatchResourcesResponse]:
        async for report in self._service.watch_health(SERVICE, pb):
            yield report


def add(server: grpc.aio.Server, service: DraService) -> str:
    """Serve it on ``server``; its full wire name."""
    pb_grpc.add_DRAResourceHealthServicer_to_server(_Servicer(service), server)  # type: ignore[no-untyped-call]
    return str(pb.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name)

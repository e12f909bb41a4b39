"""The fake kubelet's side of devshim's EXPERIMENTAL v1beta2: the only module importing its stubs.

proto/v1beta2/api.proto is v1beta1's shape under package v1beta2 plus what KEP-3162 proposed
(kubernetes/enhancements#3080, closed unmerged): the options flags deallocate_available and
post_stop_container_required, and the RPCs Deallocate and PostStopContainer. Upstream has
published no v1beta2; this follows devshim's. Everything shared with v1beta1 is in wire.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from shim.generated.v1beta2 import api_pb2, api_pb2_grpc

from .api import RegisterHandler
from .wire import PluginClientBase, Wire

VERSION = "v1beta2"


class PluginClientV1Beta2(PluginClientBase):
    """The kubelet's v1beta2 connection to one plugin: api.PluginClient plus the two KEP-3162
    calls (api.LifecycleClient)."""

    pb = api_pb2
    pb_grpc = api_pb2_grpc

    async def deallocate(self, device_ids: Sequence[str], timeout: float) -> None:
        await self._stub.Deallocate(api_pb2.DeallocateRequest(devices_ids=device_ids), timeout=timeout)

    async def post_stop(self, device_ids: Sequence[str], timeout: float) -> None:
        request = api_pb2.PostStopContainerRequest(devices_ids=device_ids)
        await self._stub.PostStopContainer(request, timeout=timeout)


WIRE = Wire(VERSION, api_pb2, api_pb2_grpc, PluginClientV1Beta2)


def add_registration_service(server: grpc.aio.Server, handler: RegisterHandler) -> None:
    """Serve v1beta2.Registration on `server`, passing every Register call to `handler`."""
    WIRE.add_registration_service(server, handler)

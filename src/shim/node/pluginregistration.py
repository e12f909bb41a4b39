"""The kubelet's plugin-watcher registration API, served on a plugin's registration socket.

The only serving-path module that imports the pluginregistration stubs. The kubelet
calls GetInfo with a 1 s deadline (pluginmanager operation_generator.go), so the
answer is built once, from memory, never from a driver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from loguru import logger

from shim.generated.pluginregistration.v1 import api_pb2 as pb
from shim.generated.pluginregistration.v1 import api_pb2_grpc as pb_grpc

SERVICE_NAME = "pluginregistration.Registration"
DEVICE_PLUGIN_TYPE = "DevicePlugin"
DRA_PLUGIN_TYPE = "DRAPlugin"


class RegistrationServicer(pb_grpc.RegistrationServicer):
    def __init__(self, info: pb.PluginInfo, on_status: Callable[[bool, str], None]) -> None:
        self._info = info
        self._on_status = on_status

    async def GetInfo(
        self, request: pb.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PluginInfo:
        return self._info

    async def NotifyRegistrationStatus(
        self, request: pb.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RegistrationStatusResponse:
        logger.log(
            "INFO" if request.plugin_registered else "ERROR",
            "{}: the kubelet's plugin watcher {}",
            self._info.name,
            "registered it" if request.plugin_registered else f"refused it: {request.error}",
        )
        self._on_status(request.plugin_registered, request.error)
        return pb.RegistrationStatusResponse()


def add_registration_service(
    server: grpc.aio.Server,
    name: str,
    versions: tuple[str, ...],
    on_status: Callable[[bool, str], None],
    *,
    plugin_type: str = DEVICE_PLUGIN_TYPE,
    endpoint: str = "",
) -> str:
    """``name``: the resource (a device plugin) or the DRA driver; ``endpoint``: the plugin's
    own socket, where it is not this one."""
    # An empty endpoint tells the kubelet the plugin's service is on this same socket (a
    # device plugin's, in plugins_registry, out of reach of the device-plugins cleanup).
    info = pb.PluginInfo(type=plugin_type, name=name, endpoint=endpoint, supported_versions=versions)
    pb_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
        RegistrationServicer(info, on_status), server
    )
    return SERVICE_NAME

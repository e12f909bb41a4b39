"""The fake kubelet's pluginregistration v1 wire: the only module of it that imports those stubs.

The kubelet's plugin manager calls the Registration service a plugin serves on its socket in
plugins_registry (GetInfo, then NotifyRegistrationStatus). This module holds the kubelet's client
for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from shim.generated.pluginregistration.v1 import api_pb2, api_pb2_grpc

from .records import PluginInfo

# k8s.io/kubelet/pkg/apis/pluginregistration/v1 constants.go: the plugin types.
DEVICE_PLUGIN = "DevicePlugin"
CSI_PLUGIN = "CSIPlugin"
DRA_PLUGIN = "DRAPlugin"

_Context = grpc.aio.ServicerContext[Any, Any]


def info_from_proto(message: api_pb2.PluginInfo) -> PluginInfo:
    return PluginInfo(message.type, message.name, message.endpoint, tuple(message.supported_versions))


def info_to_proto(info: PluginInfo) -> api_pb2.PluginInfo:
    return api_pb2.PluginInfo(
        type=info.type, name=info.name, endpoint=info.endpoint, supported_versions=info.supported_versions
    )


class RegistrationClient:
    """The plugin manager's connection to one registration socket (operation_generator.go dial)."""

    def __init__(self, socket_path: Path) -> None:
        # operation_generator.go dial: a plain unix dial on a ClientConn of its own (see v1beta1.py).
        options = (("grpc.use_local_subchannel_pool", 1),)
        self._channel = grpc.aio.insecure_channel(f"unix:{socket_path}", options=options)
        self._stub = api_pb2_grpc.RegistrationStub(self._channel)  # type: ignore[no-untyped-call]
        self._closed = False

    async def connect(self) -> None:
        # grpc.WithBlock: the dial only succeeds once the socket answers; the caller bounds it.
        await self._channel.channel_ready()

    async def get_info(self, timeout: float) -> PluginInfo:
        return info_from_proto(await self._stub.GetInfo(api_pb2.InfoRequest(), timeout=timeout))

    async def notify(self, registered: bool, error: str, timeout: float) -> None:
        status = api_pb2.RegistrationStatus(plugin_registered=registered, error=error)
        await self._stub.NotifyRegistrationStatus(status, timeout=timeout)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._channel.close(None)

"""The fake kubelet's v1beta1 wire: the only module of it that imports the v1beta1 stubs.

Everything v1beta1 shares with devshim's v1beta2 (the translations, the Registration servicer,
the plugin client) is written once in wire.py; this module hands it the v1beta1 generated modules.
adapters/legacy uses VERSION, PluginClientV1Beta1 and
add_registration_service.
"""

from __future__ import annotations

import grpc

from shim.generated.v1beta1 import api_pb2, api_pb2_grpc

from .api import RegisterHandler
from .wire import PluginClientBase, Wire

VERSION = "v1beta1"  # k8s.io/kubelet deviceplugin/v1beta1 constants.go Version


class PluginClientV1Beta1(PluginClientBase):
    """The kubelet's v1beta1 connection to one plugin (client.go + endpoint.go); see api.PluginClient."""

    pb = api_pb2
    pb_grpc = api_pb2_grpc


WIRE = Wire(VERSION, api_pb2, api_pb2_grpc, PluginClientV1Beta1)


def add_registration_service(server: grpc.aio.Server, handler: RegisterHandler) -> None:
    """Serve v1beta1.Registration on `server`, passing every Register call to `handler`."""
    WIRE.add_registration_service(server, handler)

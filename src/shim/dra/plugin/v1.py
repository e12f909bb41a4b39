"""DRAPlugin v1 (k8s.io/kubelet/pkg/apis/dra/v1): the only serving-path importer of its stubs."""

from __future__ import annotations

from shim.dra.plugin import common
from shim.generated.dra.v1 import api_pb2 as pb
from shim.generated.dra.v1 import api_pb2_grpc as pb_grpc


class Servicer(common.PluginServicer, pb_grpc.DRAPluginServicer):
    pb = pb
    version = "v1.DRAPlugin"


VERSION = common.Version(Servicer, pb_grpc.add_DRAPluginServicer_to_server)

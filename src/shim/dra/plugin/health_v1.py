"""DRAResourceHealth v1 (k8s.io/kubelet/pkg/apis/dra-health/v1): the only serving-path
importer of its stubs."""

from __future__ import annotations

from shim.dra.plugin import common
from shim.generated.drahealth.v1 import api_pb2 as pb
from shim.generated.drahealth.v1 import api_pb2_grpc as pb_grpc


class Servicer(common.HealthServicer, pb_grpc.DRAResourceHealthServicer):
    pb = pb
    version = "v1.DRAResourceHealth"


VERSION = common.Version(Servicer, pb_grpc.add_DRAResourceHealthServicer_to_server)

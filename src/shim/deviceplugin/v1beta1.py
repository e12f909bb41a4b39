"""The kubelet device-plugin API v1beta1 <-> the neutral model.

The only module in the serving path that imports the v1beta1 stubs (a ruff
banned-import rule keeps it so); what v1beta1 shares with other versions is in
common.py, which works on whichever version's messages it is given.
"""

from __future__ import annotations

from shim.deviceplugin import common
from shim.generated.v1beta1 import api_pb2 as pb
from shim.generated.v1beta1 import api_pb2_grpc as pb_grpc
from shim.model import Capabilities

NAME = "v1beta1"


def options_from_model(caps: Capabilities) -> pb.DevicePluginOptions:
    return pb.DevicePluginOptions(
        pre_start_required=caps.pre_start,
        get_preferred_allocation_available=caps.preferred_allocation,
    )


class DevicePluginServicer(common.CommonServicer, pb_grpc.DevicePluginServicer):
    pb = pb
    to_options = staticmethod(options_from_model)


API = common.VersionApi(NAME, pb, pb_grpc, DevicePluginServicer, options_from_model)

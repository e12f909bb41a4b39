"""A fake kubelet for testing device plugins over real unix sockets (later `devshim compat`).

    async with FakeKubelet(plugin_dir) as kubelet:
        session = await kubelet.wait_for_plugin("example.com/widget")
        devices = await session.wait_for_list(lambda devices: len(devices) == 4)
        ids, grant = await session.admit(2)

Only v1beta1.py (and later one module per API version) touches generated stubs; everything a test
sees is a record from records.py.
"""

from . import records
from .dirs import CHECKPOINT_FILE, CleanupMode
from .errors import (
    AdmissionRejected,
    EndpointStopped,
    FakeKubeletError,
    ProtocolViolation,
    RegistrationRejected,
)
from .fake_kubelet import KUBELET_SOCKET, FakeKubelet
from .records import DeviceState, Grant, PluginOptions, RegistrationRecord
from .session import PRESTART_TIMEOUT_S, PluginSession

__all__ = [
    "CHECKPOINT_FILE",
    "KUBELET_SOCKET",
    "PRESTART_TIMEOUT_S",
    "AdmissionRejected",
    "CleanupMode",
    "DeviceState",
    "EndpointStopped",
    "FakeKubelet",
    "FakeKubeletError",
    "Grant",
    "PluginOptions",
    "PluginSession",
    "ProtocolViolation",
    "RegistrationRecord",
    "RegistrationRejected",
    "records",
]

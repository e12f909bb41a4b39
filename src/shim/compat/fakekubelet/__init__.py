"""A fake kubelet for testing device plugins over real unix sockets (and `devshim compat`).

    async with FakeKubelet(plugin_dir) as kubelet:
        session = await kubelet.wait_for_plugin("example.com/widget")
        devices = await session.wait_for_list(lambda devices: len(devices) == 4)
        ids, grant = await session.admit(2)

With `pod_resources_socket=` it also serves the PodResources API for the pods it runs
(`await kubelet.run_pod("default", "job", [ContainerSpec("main", "example.com/widget", 2)])`),
and with `plugins_registry=` it registers the plugins whose sockets appear there. `versions=`
chooses the device plugin API versions it speaks (API_VERSIONS: v1beta1 and devshim's
experimental v1beta2), `profile=` the kubelet release whose behaviour it follows (profiles.py:
"1.24", "1.25-1.32", "1.33+", "next"), and `await kubelet.restart(versions=..., profile=...)`
upgrades or downgrades it.

Only the wire modules (v1beta1.py, v1beta2.py, pluginregistration.py, podresources.py) touch
generated stubs; everything a test sees is a record from records.py.
"""

from shim.facts import KUBELET_SOCKET

from . import records
from .dirs import CHECKPOINT_FILE, CleanupMode
from .errors import (
    AdmissionRejected,
    EndpointStopped,
    FakeKubeletError,
    ProtocolViolation,
    RegistrationRejected,
)
from .fake_kubelet import FakeKubelet
from .profiles import DEPRECATION_FILE, PROFILES, Profile, profile_for_release, profile_named
from .records import (
    CLASSIC,
    WATCHER,
    AssignedDevice,
    ContainerSpec,
    DeviceState,
    Grant,
    Notification,
    PluginInfo,
    PluginOptions,
    PodContainer,
    RegistrationRecord,
    RunningPod,
)
from .session import PluginSession
from .versions import API_VERSIONS
from .watcher import WatchMode

__all__ = [
    "API_VERSIONS",
    "CHECKPOINT_FILE",
    "CLASSIC",
    "DEPRECATION_FILE",
    "KUBELET_SOCKET",
    "PROFILES",
    "WATCHER",
    "AdmissionRejected",
    "AssignedDevice",
    "CleanupMode",
    "ContainerSpec",
    "DeviceState",
    "EndpointStopped",
    "FakeKubelet",
    "FakeKubeletError",
    "Grant",
    "Notification",
    "PluginInfo",
    "PluginOptions",
    "PluginSession",
    "Profile",
    "PodContainer",
    "ProtocolViolation",
    "RegistrationRecord",
    "RegistrationRejected",
    "RunningPod",
    "WatchMode",
    "profile_for_release",
    "profile_named",
    "records",
]

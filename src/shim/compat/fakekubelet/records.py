"""What the fake kubelet saw, as small frozen, version-neutral dataclasses.

Tests assert against these instead of generated protobuf messages, so one test can run against
every kubelet API version (tests/compat is parametrized over versions). They are deliberately not
shim's own model types: the fake kubelet is an independent observer of the shim, and sharing the
shim's types would let a translation bug hide on both sides of the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# The two health strings of the device plugin API (api.proto: Healthy/Unhealthy constants).
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# How a plugin registered: by calling Register on kubelet.sock, or found by the plugin watcher.
CLASSIC = "classic"
WATCHER = "watcher"


@dataclass(frozen=True)
class DeviceState:
    """One device as reported in a ListAndWatch message."""

    id: str
    health: str
    numa_nodes: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        # manager.go genericDeviceUpdateCallback: anything but exactly "Healthy" counts as unhealthy.
        return self.health == HEALTHY


@dataclass(frozen=True)
class PluginOptions:
    """The DevicePluginOptions a plugin declared; the fields are named like the message's.

    The last two exist only in devshim's experimental v1beta2 (KEP-3162's proposal); a v1beta1
    plugin cannot set them, so they stay False there.
    """

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False
    deallocate_available: bool = False
    post_stop_container_required: bool = False


Mount = tuple[str, str, bool]
"""(container_path, host_path, read_only)"""

DeviceNode = tuple[str, str, str]
"""(container_path, host_path, permissions)"""


@dataclass(frozen=True)
class Grant:
    """One container's answer to Allocate: what the runtime would be told to inject."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class RegisterRequest:
    """A Register call as received, before the kubelet acts on it.

    `options` is None when the plugin left the field unset (it is a message field, so presence is
    observable); older kubelets read the options from here, newer ones ask GetDevicePluginOptions.
    """

    version: str
    endpoint: str
    resource_name: str
    options: PluginOptions | None


@dataclass(frozen=True)
class RegistrationRecord:
    """One Register call and its outcome.

    `options` is what the plugin sent in RegisterRequest; the options the kubelet acts on come
    from GetDevicePluginOptions and live on the PluginSession. `received_at` is time.monotonic()
    taken as the call arrived, so tests can measure re-registration latency against
    FakeKubelet.restarts. `error` is None when the registration succeeded. `path` is CLASSIC for a
    Register call, WATCHER for a plugin found in plugins_registry; `socket` is then the path of its
    registration socket, `endpoint` the DevicePlugin socket dialled, `version` the API version used
    (or the plugin's supported versions, comma-separated, when none is supported) and `options` None.
    """

    resource_name: str
    endpoint: str
    version: str
    options: PluginOptions | None
    received_at: float
    error: str | None = None
    path: str = CLASSIC
    socket: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


# -- the plugin watcher path (pluginregistration v1) ----------------------------------------------


@dataclass(frozen=True)
class PluginInfo:
    """A plugin's answer to GetInfo on its registration socket."""

    type: str
    name: str
    endpoint: str = ""
    supported_versions: tuple[str, ...] = ()


class Notification(NamedTuple):
    """One NotifyRegistrationStatus the kubelet sent; `socket` is relative to plugins_registry."""

    socket: str
    registered: bool
    error: str


# -- pods and PodResources --------------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerSpec:
    """One container of a pod for FakeKubelet.run_pod: it needs `count` devices of `resource`.

    `init` marks a regular (run-to-completion) init container; sidecars are not modelled.
    """

    name: str
    resource: str
    count: int
    init: bool = False


@dataclass(frozen=True)
class AssignedDevice:
    """One device a container holds, as PodResources reports it."""

    resource: str
    id: str
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class PodContainer:
    name: str
    devices: tuple[AssignedDevice, ...] = ()
    init: bool = False

    @property
    def device_ids(self) -> list[str]:
        return list(dict.fromkeys(device.id for device in self.devices))


@dataclass(frozen=True)
class RunningPod:
    namespace: str
    name: str
    containers: tuple[PodContainer, ...] = ()

    def container(self, name: str) -> PodContainer:
        for container in self.containers:
            if container.name == name:
                return container
        raise KeyError(f"pod {self.namespace}/{self.name} has no container {name!r}")

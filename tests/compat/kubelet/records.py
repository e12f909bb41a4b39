"""What the fake kubelet saw, as small frozen, version-neutral dataclasses.

Tests assert against these instead of generated protobuf messages, so one test can run against
every kubelet API version (tests/compat is parametrized over versions). They are deliberately not
shim's own model types: the fake kubelet is an independent observer of the shim, and sharing the
shim's types would let a translation bug hide on both sides of the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The two health strings of the device plugin API (api.proto: Healthy/Unhealthy constants).
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


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
    """The DevicePluginOptions a plugin declared."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


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
    FakeKubelet.restarts. `error` is None when the registration succeeded.
    """

    resource_name: str
    endpoint: str
    version: str
    options: PluginOptions | None
    received_at: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

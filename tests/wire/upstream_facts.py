"""Upstream facts of the kubelet gRPC APIs devshim speaks, as plain data.

Written by hand from the upstream Kubernetes sources, NOT from proto/ or from the
generated stubs, so that tests/wire/test_descriptors_match_upstream.py compares our
generated descriptors with an independent statement of what the kubelet puts on the wire.

Sources (repository kubernetes/kubernetes, the version read is given by commit):

* deviceplugin/v1beta1: staging/src/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto
  at 0619cbbff1ffe94b1745682e1cd1aea1e68cce97 (the version with GetPreferredAllocation,
  ``devices_ids`` and CDIDevice / ``cdi_devices = 5``; no gogoproto import).
* pluginregistration/v1: staging/src/k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto
  at 56e225f4b8de5d1c920d6b67829ee3e0f0ae1d62 (package "pluginregistration", not "v1").
* podresources/v1: staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto
  at 95f08499d652a6211121d8af35f470609217c730 (List, GetAllocatableResources, Get;
  DynamicResource field 1 ``class_name`` removed in 1.31, left as a comment).

All three are ``syntax = "proto3"`` and import nothing. Upstream declares no enums, no
oneofs, no nested messages, no ``optional`` keyword, no ``reserved`` and no client streaming.

The DRA APIs (the kubelet is the client; the plugin serves them) were read from the Go
module cache, ``$(go env GOMODCACHE)/k8s.io/kubelet@<release>/pkg/apis/...``: the module
k8s.io/kubelet is published from staging/src/k8s.io/kubelet, and each release's
``api.proto`` there is the upstream file. Each version is stated as its newest definition,
from the newest cached module that has it (k8s.io/kubelet@v0.37.2 for all four), with the
first cached release that has the version and the release each later field first appears in
(cached releases: v0.30.14, v0.31.14, v0.32.13, v0.33.13, v0.34.2, v0.34.4, v0.35.4,
v0.36.3, v0.37.2; "first" means first among those).

* dra/v1beta1: pkg/apis/dra/v1beta1/api.proto. Package "k8s.io.kubelet.pkg.apis.dra.v1beta1",
  first in v0.32.13. Unchanged on the wire since (v0.32-v0.34 imported gogo.proto for Go
  names only; v0.35.4 dropped that import).
* dra/v1: pkg/apis/dra/v1/api.proto. v1beta1 under package "k8s.io.kubelet.pkg.apis.dra.v1",
  first in v0.34.2; ``optional string share_id = 5`` in Device first in v0.35.4 (the one
  field upstream declares with the ``optional`` keyword: explicit presence).
* dra-health/v1alpha1: pkg/apis/dra-health/v1alpha1/api.proto. Package "v1alpha1", first in
  v0.34.2; DeviceHealth ``health_check_timeout_seconds = 4`` first in v0.35.4 and
  ``message = 5`` first in v0.36.3. One file-level enum, HealthStatus.
* dra-health/v1: pkg/apis/dra-health/v1/api.proto. v1alpha1 (as of v0.36.3) under package
  "v1", first in v0.37.2.

All four are ``syntax = "proto3"`` and (in their newest definitions) import nothing; they
declare no oneof but share_id's synthetic one, no nested message but map entries, no
``reserved`` and no client streaming.

The wire service names (``ServiceName`` in upstream's generated api.pb.go / api_grpc.pb.go)
and the strings a plugin lists in its registration's ``supported_versions`` (the
``DRAPluginService`` / ``DRAResourceHealthService`` constants in types.go) were read from
the same module release.

How to read the table:

* ``Rpc.input`` / ``Rpc.output`` / ``Field.message`` name a message of the same package;
  ``Field.enum`` names an enum of the same package.
* ``Field.type`` is the proto type as written upstream: "string", "bool", "int32",
  "int64", "uint64", "message", "enum" or "map<K,V>", V being a scalar type or a message
  of the same package (e.g. "map<string,NodePrepareResourceResponse>").
* ``Field.label`` is "repeated" for ``repeated`` fields and for maps (a map is a repeated
  entry message on the wire), "optional" for every other (proto3 singular) field.
* ``Field.proto3_optional`` is True where upstream writes the ``optional`` keyword on a
  proto3 scalar (explicit presence: set-but-default is written, and a synthetic oneof
  ``_<name>`` holds the field).
* ``Proto.upstream_commit`` (a kubernetes/kubernetes commit) or ``Proto.upstream_release``
  (a k8s.io/kubelet module release) says where the table was read; ``go_package`` is
  stated only where it was checked (None: not stated here).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rpc:
    name: str
    input: str
    output: str
    server_streaming: bool = False


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    type: str
    label: str = "optional"
    message: str | None = None
    enum: str | None = None
    proto3_optional: bool = False


@dataclass(frozen=True)
class EnumValue:
    name: str
    number: int


@dataclass(frozen=True)
class Proto:
    upstream_path: str
    syntax: str
    package: str
    services: dict[str, tuple[Rpc, ...]]
    messages: dict[str, tuple[Field, ...]]
    # Field numbers upstream removed (tombstoned in a comment): message -> {number: old name}.
    removed_fields: dict[str, dict[int, str]] = field(default_factory=dict)
    # Where the table was read: exactly one of these two.
    upstream_commit: str | None = None  # kubernetes/kubernetes commit
    upstream_release: str | None = None  # k8s.io/kubelet module release, e.g. "v0.37.2"
    # The first cached k8s.io/kubelet release with this API version, and for fields added
    # later, "Message.field" -> the first cached release that has it (None / {}: not stated).
    first_release: str | None = None
    added_in: dict[str, str] = field(default_factory=dict)
    go_package: str | None = None
    enums: dict[str, tuple[EnumValue, ...]] = field(default_factory=dict)
    # Service -> its gRPC name on the wire (the "/<name>/<Rpc>" path), as upstream's Go
    # ServiceDesc states it; and service -> the string a plugin advertises for it in
    # pluginregistration's supported_versions (DRA only; {}: not stated).
    wire_service_names: dict[str, str] = field(default_factory=dict)
    registration_names: dict[str, str] = field(default_factory=dict)


DEVICEPLUGIN_V1BETA1 = Proto(
    upstream_path="staging/src/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto",
    upstream_commit="0619cbbff1ffe94b1745682e1cd1aea1e68cce97",
    syntax="proto3",
    package="v1beta1",
    services={
        "Registration": (Rpc("Register", "RegisterRequest", "Empty"),),
        "DevicePlugin": (
            Rpc("GetDevicePluginOptions", "Empty", "DevicePluginOptions"),
            Rpc("ListAndWatch", "Empty", "ListAndWatchResponse", server_streaming=True),
            Rpc("GetPreferredAllocation", "PreferredAllocationRequest", "PreferredAllocationResponse"),
            Rpc("Allocate", "AllocateRequest", "AllocateResponse"),
            Rpc("PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse"),
        ),
    },
    messages={
        "DevicePluginOptions": (
            Field("pre_start_required", 1, "bool"),
            Field("get_preferred_allocation_available", 2, "bool"),
        ),
        "RegisterRequest": (
            Field("version", 1, "string"),
            Field("endpoint", 2, "string"),
            Field("resource_name", 3, "string"),
            Field("options", 4, "message", message="DevicePluginOptions"),
        ),
        "Empty": (),
        "ListAndWatchResponse": (Field("devices", 1, "message", "repeated", "Device"),),
        "TopologyInfo": (Field("nodes", 1, "message", "repeated", "NUMANode"),),
        "NUMANode": (Field("ID", 1, "int64"),),
        "Device": (
            Field("ID", 1, "string"),
            Field("health", 2, "string"),
            Field("topology", 3, "message", message="TopologyInfo"),
        ),
        "PreStartContainerRequest": (Field("devices_ids", 1, "string", "repeated"),),
        "PreStartContainerResponse": (),
        "PreferredAllocationRequest": (
            Field("container_requests", 1, "message", "repeated", "ContainerPreferredAllocationRequest"),
        ),
        "ContainerPreferredAllocationRequest": (
            Field("available_deviceIDs", 1, "string", "repeated"),
            Field("must_include_deviceIDs", 2, "string", "repeated"),
            Field("allocation_size", 3, "int32"),
        ),
        "PreferredAllocationResponse": (
            Field("container_responses", 1, "message", "repeated", "ContainerPreferredAllocationResponse"),
        ),
        "ContainerPreferredAllocationResponse": (Field("deviceIDs", 1, "string", "repeated"),),
        "AllocateRequest": (
            Field("container_requests", 1, "message", "repeated", "ContainerAllocateRequest"),
        ),
        "ContainerAllocateRequest": (Field("devices_ids", 1, "string", "repeated"),),
        "CDIDevice": (Field("name", 1, "string"),),
        "AllocateResponse": (
            Field("container_responses", 1, "message", "repeated", "ContainerAllocateResponse"),
        ),
        "ContainerAllocateResponse": (
            Field("envs", 1, "map<string,string>", "repeated"),
            Field("mounts", 2, "message", "repeated", "Mount"),
            Field("devices", 3, "message", "repeated", "DeviceSpec"),
            Field("annotations", 4, "map<string,string>", "repeated"),
            Field("cdi_devices", 5, "message", "repeated", "CDIDevice"),
        ),
        "Mount": (
            Field("container_path", 1, "string"),
            Field("host_path", 2, "string"),
            Field("read_only", 3, "bool"),
        ),
        "DeviceSpec": (
            Field("container_path", 1, "string"),
            Field("host_path", 2, "string"),
            Field("permissions", 3, "string"),
        ),
    },
    removed_fields={},
)

PLUGINREGISTRATION_V1 = Proto(
    upstream_path="staging/src/k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
    upstream_commit="56e225f4b8de5d1c920d6b67829ee3e0f0ae1d62",
    syntax="proto3",
    package="pluginregistration",
    services={
        "Registration": (
            Rpc("GetInfo", "InfoRequest", "PluginInfo"),
            Rpc("NotifyRegistrationStatus", "RegistrationStatus", "RegistrationStatusResponse"),
        ),
    },
    messages={
        "PluginInfo": (
            Field("type", 1, "string"),
            Field("name", 2, "string"),
            Field("endpoint", 3, "string"),
            Field("supported_versions", 4, "string", "repeated"),
        ),
        "RegistrationStatus": (
            Field("plugin_registered", 1, "bool"),
            Field("error", 2, "string"),
        ),
        "RegistrationStatusResponse": (),
        "InfoRequest": (),
    },
    removed_fields={},
)

PODRESOURCES_V1 = Proto(
    upstream_path="staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto",
    upstream_commit="95f08499d652a6211121d8af35f470609217c730",
    syntax="proto3",
    package="v1",
    services={
        "PodResourcesLister": (
            Rpc("List", "ListPodResourcesRequest", "ListPodResourcesResponse"),
            Rpc("GetAllocatableResources", "AllocatableResourcesRequest", "AllocatableResourcesResponse"),
            Rpc("Get", "GetPodResourcesRequest", "GetPodResourcesResponse"),
        ),
    },
    messages={
        "AllocatableResourcesRequest": (),
        "AllocatableResourcesResponse": (
            Field("devices", 1, "message", "repeated", "ContainerDevices"),
            Field("cpu_ids", 2, "int64", "repeated"),
            Field("memory", 3, "message", "repeated", "ContainerMemory"),
        ),
        "ListPodResourcesRequest": (),
        "ListPodResourcesResponse": (Field("pod_resources", 1, "message", "repeated", "PodResources"),),
        "PodResources": (
            Field("name", 1, "string"),
            Field("namespace", 2, "string"),
            Field("containers", 3, "message", "repeated", "ContainerResources"),
        ),
        "ContainerResources": (
            Field("name", 1, "string"),
            Field("devices", 2, "message", "repeated", "ContainerDevices"),
            Field("cpu_ids", 3, "int64", "repeated"),
            Field("memory", 4, "message", "repeated", "ContainerMemory"),
            Field("dynamic_resources", 5, "message", "repeated", "DynamicResource"),
        ),
        "ContainerMemory": (
            Field("memory_type", 1, "string"),
            Field("size", 2, "uint64"),
            Field("topology", 3, "message", message="TopologyInfo"),
        ),
        "ContainerDevices": (
            Field("resource_name", 1, "string"),
            Field("device_ids", 2, "string", "repeated"),
            Field("topology", 3, "message", message="TopologyInfo"),
        ),
        "TopologyInfo": (Field("nodes", 1, "message", "repeated", "NUMANode"),),
        "NUMANode": (Field("ID", 1, "int64"),),
        "DynamicResource": (
            # Field 1 (string class_name) was removed upstream in 1.31: see removed_fields.
            Field("claim_name", 2, "string"),
            Field("claim_namespace", 3, "string"),
            Field("claim_resources", 4, "message", "repeated", "ClaimResource"),
        ),
        "ClaimResource": (
            Field("cdi_devices", 1, "message", "repeated", "CDIDevice"),
            Field("driver_name", 2, "string"),
            Field("pool_name", 3, "string"),
            Field("device_name", 4, "string"),
        ),
        "CDIDevice": (Field("name", 1, "string"),),
        "GetPodResourcesRequest": (
            Field("pod_name", 1, "string"),
            Field("pod_namespace", 2, "string"),
        ),
        "GetPodResourcesResponse": (Field("pod_resources", 1, "message", message="PodResources"),),
    },
    removed_fields={"DynamicResource": {1: "class_name"}},
)


def _dra_plugin_messages(*, with_share_id: bool) -> dict[str, tuple[Field, ...]]:
    """DRAPlugin's messages: identical in v1beta1 and v1 but for Device.share_id (v1, v0.35+)."""
    device: tuple[Field, ...] = (
        Field("request_names", 1, "string", "repeated"),
        Field("pool_name", 2, "string"),
        Field("device_name", 3, "string"),
        Field("cdi_device_ids", 4, "string", "repeated"),
    )
    if with_share_id:
        device += (Field("share_id", 5, "string", proto3_optional=True),)
    return {
        "NodePrepareResourcesRequest": (Field("claims", 1, "message", "repeated", "Claim"),),
        "NodePrepareResourcesResponse": (
            Field("claims", 1, "map<string,NodePrepareResourceResponse>", "repeated"),
        ),
        "NodePrepareResourceResponse": (
            Field("devices", 1, "message", "repeated", "Device"),
            Field("error", 2, "string"),
        ),
        "Device": device,
        "NodeUnprepareResourcesRequest": (Field("claims", 1, "message", "repeated", "Claim"),),
        "NodeUnprepareResourcesResponse": (
            Field("claims", 1, "map<string,NodeUnprepareResourceResponse>", "repeated"),
        ),
        "NodeUnprepareResourceResponse": (Field("error", 1, "string"),),
        "Claim": (
            Field("namespace", 1, "string"),
            Field("uid", 2, "string"),
            Field("name", 3, "string"),
        ),
    }


DRA_PLUGIN_RPCS = (
    Rpc("NodePrepareResources", "NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
    Rpc("NodeUnprepareResources", "NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse"),
)

DRA_V1BETA1 = Proto(
    upstream_path="staging/src/k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto",
    upstream_release="v0.37.2",
    first_release="v0.32.13",
    syntax="proto3",
    package="k8s.io.kubelet.pkg.apis.dra.v1beta1",
    go_package="k8s.io/kubelet/pkg/apis/dra/v1beta1",
    services={"DRAPlugin": DRA_PLUGIN_RPCS},
    messages=_dra_plugin_messages(with_share_id=False),
    wire_service_names={"DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"},
    registration_names={"DRAPlugin": "v1beta1.DRAPlugin"},
)

DRA_V1 = Proto(
    upstream_path="staging/src/k8s.io/kubelet/pkg/apis/dra/v1/api.proto",
    upstream_release="v0.37.2",
    first_release="v0.34.2",
    added_in={"Device.share_id": "v0.35.4"},
    syntax="proto3",
    package="k8s.io.kubelet.pkg.apis.dra.v1",
    go_package="k8s.io/kubelet/pkg/apis/dra/v1",
    services={"DRAPlugin": DRA_PLUGIN_RPCS},
    messages=_dra_plugin_messages(with_share_id=True),
    wire_service_names={"DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"},
    registration_names={"DRAPlugin": "v1.DRAPlugin"},
)

DRA_HEALTH_RPCS = (
    Rpc(
        "NodeWatchResources", "NodeWatchResourcesRequest", "NodeWatchResourcesResponse", server_streaming=True
    ),
)

DRA_HEALTH_ENUMS: dict[str, tuple[EnumValue, ...]] = {
    "HealthStatus": (EnumValue("UNKNOWN", 0), EnumValue("HEALTHY", 1), EnumValue("UNHEALTHY", 2)),
}

DRA_HEALTH_MESSAGES: dict[str, tuple[Field, ...]] = {
    "NodeWatchResourcesRequest": (),
    "DeviceIdentifier": (
        Field("pool_name", 1, "string"),
        Field("device_name", 2, "string"),
    ),
    "DeviceHealth": (
        Field("device", 1, "message", message="DeviceIdentifier"),
        Field("health", 2, "enum", enum="HealthStatus"),
        Field("last_updated_time", 3, "int64"),
        Field("health_check_timeout_seconds", 4, "int64"),
        Field("message", 5, "string"),
    ),
    "NodeWatchResourcesResponse": (Field("devices", 1, "message", "repeated", "DeviceHealth"),),
}

DRA_HEALTH_V1ALPHA1 = Proto(
    upstream_path="staging/src/k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto",
    upstream_release="v0.37.2",
    first_release="v0.34.2",
    added_in={"DeviceHealth.health_check_timeout_seconds": "v0.35.4", "DeviceHealth.message": "v0.36.3"},
    syntax="proto3",
    package="v1alpha1",
    go_package="k8s.io/kubelet/pkg/apis/dra-health/v1alpha1",
    services={"DRAResourceHealth": DRA_HEALTH_RPCS},
    messages=DRA_HEALTH_MESSAGES,
    enums=DRA_HEALTH_ENUMS,
    wire_service_names={"DRAResourceHealth": "v1alpha1.DRAResourceHealth"},
    registration_names={"DRAResourceHealth": "v1alpha1.DRAResourceHealth"},
)

DRA_HEALTH_V1 = Proto(
    upstream_path="staging/src/k8s.io/kubelet/pkg/apis/dra-health/v1/api.proto",
    upstream_release="v0.37.2",
    first_release="v0.37.2",
    syntax="proto3",
    package="v1",
    go_package="k8s.io/kubelet/pkg/apis/dra-health/v1",
    services={"DRAResourceHealth": DRA_HEALTH_RPCS},
    messages=DRA_HEALTH_MESSAGES,
    enums=DRA_HEALTH_ENUMS,
    wire_service_names={"DRAResourceHealth": "v1.DRAResourceHealth"},
    registration_names={"DRAResourceHealth": "v1.DRAResourceHealth"},
)

# Keyed by the upstream API directory under staging/src/k8s.io/kubelet/pkg/apis/.
UPSTREAM: dict[str, Proto] = {
    "deviceplugin/v1beta1": DEVICEPLUGIN_V1BETA1,
    "pluginregistration/v1": PLUGINREGISTRATION_V1,
    "podresources/v1": PODRESOURCES_V1,
    "dra/v1beta1": DRA_V1BETA1,
    "dra/v1": DRA_V1,
    "dra-health/v1alpha1": DRA_HEALTH_V1ALPHA1,
    "dra-health/v1": DRA_HEALTH_V1,
}

"""Upstream facts of the three kubelet gRPC APIs devshim speaks, as plain data.

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

How to read the table:

* ``Rpc.input`` / ``Rpc.output`` / ``Field.message`` name a message of the same package.
* ``Field.type`` is the proto type as written upstream: "string", "bool", "int32",
  "int64", "uint64", "message" or "map<string,string>".
* ``Field.label`` is "repeated" for ``repeated`` fields and for maps (a map is a repeated
  entry message on the wire), "optional" for every other (proto3 singular) field.
"""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class Proto:
    upstream_path: str
    upstream_commit: str
    syntax: str
    package: str
    services: dict[str, tuple[Rpc, ...]]
    messages: dict[str, tuple[Field, ...]]
    # Field numbers upstream removed (tombstoned in a comment): message -> {number: old name}.
    removed_fields: dict[str, dict[int, str]]


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

# Keyed by the upstream API directory under staging/src/k8s.io/kubelet/pkg/apis/.
UPSTREAM: dict[str, Proto] = {
    "deviceplugin/v1beta1": DEVICEPLUGIN_V1BETA1,
    "pluginregistration/v1": PLUGINREGISTRATION_V1,
    "podresources/v1": PODRESOURCES_V1,
}

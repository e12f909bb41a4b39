"""Golden wire bytes for every message of the three kubelet APIs.

The expected bytes are written by hand from the protobuf encoding rules, never produced
by a helper, so they are an independent statement of what the kubelet sends and expects:

* tag = (field_number << 3) | wire_type, itself a varint (one byte for fields 1..15);
  wire type 0 = VARINT (bool, int32, int64, uint64), 2 = LEN (string, message, map entry,
  packed repeated scalars).
* varint: 7 bits per byte, least significant group first, high bit set on all but the last.
  Negative int32/int64 are sign-extended to 64 bits, so they always take 10 bytes.
* proto3 omits singular fields holding their default (0, false, ""); a set submessage is
  written even when empty (length 0); repeated messages/strings repeat the tag per element;
  repeated scalars are packed into one LEN record by default.
* a map<string,string> entry is a LEN record holding a message {key = 1; value = 2}.

Each case names the message (package.Name, as on the wire), its expected field values as
plain data keyed by upstream field names, and the hand bytes. It asserts (a) parsing the
hand bytes with the generated class gives the expected values and (b) serializing the
expected values gives exactly the hand bytes. Serialization is deterministic (maps sorted
by key); maps here have one entry or two entries in key order. Messages are built inside
the tests, not at import, so a broken proto fails cases instead of collection.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from shim.generated.pluginregistration.v1 import api_pb2 as reg
from shim.generated.podresources.v1 import api_pb2 as pr
from shim.generated.v1beta1 import api_pb2 as dp

# Proto package (the first part of a message's wire name) -> our generated module.
MODULES = {"v1beta1": dp, "pluginregistration": reg, "v1": pr}

GOLDEN = [
    # ---------------------------------------------------------------- deviceplugin v1beta1
    pytest.param("v1beta1.Empty", {}, b"", id="v1beta1.Empty"),
    pytest.param("v1beta1.PreStartContainerResponse", {}, b"", id="v1beta1.PreStartContainerResponse"),
    pytest.param(
        "v1beta1.DevicePluginOptions",
        {"pre_start_required": True, "get_preferred_allocation_available": True},
        b"\x08\x01"  # pre_start_required: field 1, VARINT: (1 << 3) | 0 = 0x08; true = 0x01
        b"\x10\x01",  # get_preferred_allocation_available: field 2, VARINT: (2 << 3) | 0 = 0x10; 0x01
        id="v1beta1.DevicePluginOptions-both-true",
    ),
    pytest.param(
        "v1beta1.DevicePluginOptions",
        {"get_preferred_allocation_available": True},
        b"\x10\x01",  # field 2 only: pre_start_required=false is the default and is not written
        id="v1beta1.DevicePluginOptions-false-omitted",
    ),
    pytest.param(
        "v1beta1.RegisterRequest",
        {
            "version": "v1beta1",
            "endpoint": "x.sock",
            "resource_name": "vendor.com/gpu",
            "options": {"pre_start_required": True, "get_preferred_allocation_available": True},
        },
        b"\x0a\x07v1beta1"  # version: field 1, LEN: (1 << 3) | 2 = 0x0a; len 7
        b"\x12\x06x.sock"  # endpoint: field 2, LEN: (2 << 3) | 2 = 0x12; len 6
        b"\x1a\x0evendor.com/gpu"  # resource_name: field 3, LEN: (3 << 3) | 2 = 0x1a; len 14 = 0x0e
        b"\x22\x04"  # options: field 4, LEN: (4 << 3) | 2 = 0x22; len 4 (the DevicePluginOptions below)
        b"\x08\x01\x10\x01",  # DevicePluginOptions{pre_start_required: true, get_preferred...: true}
        id="v1beta1.RegisterRequest",
    ),
    pytest.param(
        "v1beta1.ListAndWatchResponse",
        {
            "devices": [
                {"ID": "gpu0", "health": "Healthy"},
                {"ID": "gpu1", "health": "Unhealthy", "topology": {"nodes": [{"ID": 1}]}},
            ]
        },
        b"\x0a\x0f"  # devices[0]: field 1, LEN 0x0a; len 6 + 9 = 15 = 0x0f
        b"\x0a\x04gpu0"  # Device.ID: field 1, LEN 0x0a; len 4
        b"\x12\x07Healthy"  # Device.health: field 2, LEN 0x12; len 7
        b"\x0a\x17"  # devices[1]: field 1 again (repeated message = one record per element); 6 + 11 + 6 = 23
        b"\x0a\x04gpu1"  # Device.ID
        b"\x12\x09Unhealthy"  # Device.health: len 9
        b"\x1a\x04"  # Device.topology: field 3, LEN: (3 << 3) | 2 = 0x1a; len 4
        b"\x0a\x02"  # TopologyInfo.nodes[0]: field 1, LEN 0x0a; len 2
        b"\x08\x01",  # NUMANode.ID: field 1, VARINT 0x08; 1
        id="v1beta1.ListAndWatchResponse",
    ),
    pytest.param(
        "v1beta1.TopologyInfo",
        {"nodes": [{}, {"ID": 1}]},
        b"\x0a\x00"  # nodes[0]: field 1, LEN 0x0a; NUMANode{ID: 0} has nothing to write: len 0
        b"\x0a\x02\x08\x01",  # nodes[1]: field 1, LEN; len 2: NUMANode.ID field 1 VARINT 0x08, 1
        id="v1beta1.TopologyInfo-node-0-is-empty-record",
    ),
    pytest.param(
        "v1beta1.NUMANode",
        {"ID": 1},
        b"\x08\x01",  # ID: field 1, VARINT: (1 << 3) | 0 = 0x08; 1
        id="v1beta1.NUMANode-1",
    ),
    pytest.param("v1beta1.NUMANode", {}, b"", id="v1beta1.NUMANode-0-is-default-and-not-written"),
    pytest.param(
        "v1beta1.NUMANode",
        {"ID": 300},
        b"\x08\xac\x02",  # 300 = 0b10_0101100: low 7 bits 0x2c | 0x80 = 0xac, then 300 >> 7 = 2
        id="v1beta1.NUMANode-300-two-byte-varint",
    ),
    pytest.param(
        "v1beta1.NUMANode",
        {"ID": 4294967296},
        b"\x08\x80\x80\x80\x80\x10",  # 2**32: four empty 7-bit groups (bits 0..27), then 2**(32-28) = 0x10
        id="v1beta1.NUMANode-4294967296-above-int32",
    ),
    pytest.param(
        "v1beta1.NUMANode",
        {"ID": -1},
        b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # -1 = 2**64 - 1: nine 0x7f groups | 0x80, then 0x01
        id="v1beta1.NUMANode-negative-10-byte-varint",
    ),
    pytest.param(
        "v1beta1.NUMANode",
        {"ID": -9223372036854775808},
        b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # -2**63 = 2**63 unsigned: 9 empty groups, 0x01
        id="v1beta1.NUMANode-int64-min",
    ),
    pytest.param(
        "v1beta1.NUMANode",
        {"ID": 9223372036854775807},
        b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\x7f",  # 63 one-bits: eight 0xff groups, then 0x7f (9 bytes)
        id="v1beta1.NUMANode-int64-max",
    ),
    pytest.param(
        "v1beta1.Device",
        {"ID": "GPU-0", "health": "Healthy", "topology": {"nodes": [{"ID": 1}]}},
        b"\x0a\x05GPU-0"  # ID: field 1, LEN 0x0a; len 5
        b"\x12\x07Healthy"  # health: field 2, LEN 0x12; len 7
        b"\x1a\x04"  # topology: field 3, LEN 0x1a; len 4
        b"\x0a\x02\x08\x01",  # TopologyInfo.nodes[0] (field 1, LEN, len 2) = NUMANode{ID: 1}
        id="v1beta1.Device",
    ),
    pytest.param(
        "v1beta1.PreStartContainerRequest",
        {"devices_ids": ["d0", "d1"]},
        b"\x0a\x02d0"  # devices_ids[0]: field 1, LEN 0x0a; len 2 (repeated strings are never packed)
        b"\x0a\x02d1",  # devices_ids[1]: field 1 again
        id="v1beta1.PreStartContainerRequest",
    ),
    pytest.param(
        "v1beta1.PreferredAllocationRequest",
        {
            "container_requests": [
                {"available_deviceIDs": ["a", "b"], "must_include_deviceIDs": ["a"], "allocation_size": 1}
            ]
        },
        b"\x0a\x0b"  # container_requests[0]: field 1, LEN 0x0a; len 3 + 3 + 3 + 2 = 11 = 0x0b
        b"\x0a\x01a"  # available_deviceIDs[0]: field 1, LEN 0x0a; len 1
        b"\x0a\x01b"  # available_deviceIDs[1]
        b"\x12\x01a"  # must_include_deviceIDs[0]: field 2, LEN 0x12; len 1
        b"\x18\x01",  # allocation_size: field 3, VARINT: (3 << 3) | 0 = 0x18; 1
        id="v1beta1.PreferredAllocationRequest",
    ),
    pytest.param(
        "v1beta1.ContainerPreferredAllocationRequest",
        {"available_deviceIDs": ["d0", "d1", "d2"], "must_include_deviceIDs": ["d0"], "allocation_size": 2},
        b"\x0a\x02d0\x0a\x02d1\x0a\x02d2"  # available_deviceIDs: field 1, LEN 0x0a, once per element
        b"\x12\x02d0"  # must_include_deviceIDs: field 2, LEN 0x12
        b"\x18\x02",  # allocation_size (int32): field 3, VARINT 0x18; 2
        id="v1beta1.ContainerPreferredAllocationRequest",
    ),
    pytest.param(
        "v1beta1.ContainerPreferredAllocationRequest",
        {"allocation_size": 2147483647},
        b"\x18\xff\xff\xff\xff\x07",  # int32 max 2**31 - 1: four 0x7f groups | 0x80, then 2**3 - 1 = 0x07
        id="v1beta1.ContainerPreferredAllocationRequest-int32-max",
    ),
    pytest.param(
        "v1beta1.ContainerPreferredAllocationRequest",
        {"allocation_size": -1},
        b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # negative int32: sign-extended to 64 bits, 10 bytes
        id="v1beta1.ContainerPreferredAllocationRequest-int32-negative-10-bytes",
    ),
    pytest.param(
        "v1beta1.PreferredAllocationResponse",
        {"container_responses": [{"deviceIDs": ["d0", "d1"]}, {"deviceIDs": ["d2"]}]},
        b"\x0a\x08"  # container_responses[0]: field 1, LEN 0x0a; len 4 + 4
        b"\x0a\x02d0\x0a\x02d1"  # deviceIDs: field 1, LEN 0x0a, per element
        b"\x0a\x04"  # container_responses[1]: field 1, LEN; len 4
        b"\x0a\x02d2",
        id="v1beta1.PreferredAllocationResponse",
    ),
    pytest.param(
        "v1beta1.ContainerPreferredAllocationResponse",
        {"deviceIDs": ["d0", "d1"]},
        b"\x0a\x02d0"  # deviceIDs[0]: field 1, LEN 0x0a; len 2
        b"\x0a\x02d1",  # deviceIDs[1]
        id="v1beta1.ContainerPreferredAllocationResponse",
    ),
    pytest.param(
        "v1beta1.AllocateRequest",
        {"container_requests": [{"devices_ids": ["d0"]}, {}]},
        b"\x0a\x04"  # container_requests[0]: field 1, LEN 0x0a; len 4
        b"\x0a\x02d0"  # ContainerAllocateRequest.devices_ids[0]: field 1, LEN; len 2
        b"\x0a\x00",  # container_requests[1]: an empty element is still one record, len 0
        id="v1beta1.AllocateRequest",
    ),
    pytest.param(
        "v1beta1.ContainerAllocateRequest",
        {"devices_ids": ["d0", "d1"]},
        b"\x0a\x02d0"  # devices_ids[0]: field 1, LEN 0x0a; len 2
        b"\x0a\x02d1",  # devices_ids[1]
        id="v1beta1.ContainerAllocateRequest",
    ),
    pytest.param(
        "v1beta1.CDIDevice",
        {"name": "vendor.com/gpu=gpu0"},
        b"\x0a\x13vendor.com/gpu=gpu0",  # name: field 1, LEN 0x0a; len 14 + 5 = 19 = 0x13
        id="v1beta1.CDIDevice",
    ),
    pytest.param(
        "v1beta1.AllocateResponse",
        {"container_responses": [{"envs": {"A": "1"}}]},
        b"\x0a\x08"  # container_responses[0]: field 1, LEN 0x0a; len 8
        b"\x0a\x06"  # envs entry: field 1, LEN 0x0a; len 6
        b"\x0a\x01A"  # entry key: field 1, LEN 0x0a; len 1
        b"\x12\x011",  # entry value: field 2, LEN 0x12; len 1
        id="v1beta1.AllocateResponse",
    ),
    pytest.param(
        "v1beta1.ContainerAllocateResponse",
        {
            "envs": {"B": "2", "A": "1"},
            "mounts": [{"container_path": "/c", "host_path": "/h", "read_only": True}],
            "devices": [{"container_path": "/dev/x", "host_path": "/dev/y", "permissions": "rw"}],
            "annotations": {"k": "v"},
            "cdi_devices": [{"name": "v.com/g=0"}],
        },
        b"\x0a\x06\x0a\x01A\x12\x011"  # envs entry: field 1, LEN 0x0a, len 6 = {key 0x0a "A", value 0x12 "1"}
        b"\x0a\x06\x0a\x01B\x12\x012"  # envs entry "B": second record of field 1 (sorted by key)
        b"\x12\x0a"  # mounts[0]: field 2, LEN 0x12; len 4 + 4 + 2 = 10 = 0x0a
        b"\x0a\x02/c\x12\x02/h\x18\x01"  # Mount{container_path 0x0a, host_path 0x12, read_only 0x18: true}
        b"\x1a\x14"  # devices[0]: field 3, LEN 0x1a; len 8 + 8 + 4 = 20 = 0x14
        b"\x0a\x06/dev/x\x12\x06/dev/y\x1a\x02rw"  # DeviceSpec{container_path, host_path, permissions 0x1a}
        b"\x22\x06\x0a\x01k\x12\x01v"  # annotations entry: field 4, LEN (4 << 3) | 2 = 0x22; {"k": "v"}
        b"\x2a\x0b"  # cdi_devices[0]: field 5, LEN: (5 << 3) | 2 = 0x2a; len 11
        b"\x0a\x09v.com/g=0",  # CDIDevice.name: field 1, LEN 0x0a; len 9
        id="v1beta1.ContainerAllocateResponse-all-fields-two-env-entries",
    ),
    pytest.param(
        "v1beta1.ContainerAllocateResponse",
        {"annotations": {"io.example/a": "yes"}},
        b"\x22\x13"  # annotations entry: field 4, LEN 0x22; len 14 + 5 = 19 = 0x13
        b"\x0a\x0cio.example/a"  # key: field 1, LEN 0x0a; len 12 = 0x0c
        b"\x12\x03yes",  # value: field 2, LEN 0x12; len 3
        id="v1beta1.ContainerAllocateResponse-one-annotation",
    ),
    pytest.param(
        "v1beta1.Mount",
        {"container_path": "/c", "host_path": "/h", "read_only": True},
        b"\x0a\x02/c"  # container_path: field 1, LEN 0x0a; len 2
        b"\x12\x02/h"  # host_path: field 2, LEN 0x12; len 2
        b"\x18\x01",  # read_only (bool): field 3, VARINT: (3 << 3) | 0 = 0x18; true = 1
        id="v1beta1.Mount",
    ),
    pytest.param(
        "v1beta1.DeviceSpec",
        {"container_path": "/dev/x", "host_path": "/dev/y", "permissions": "rwm"},
        b"\x0a\x06/dev/x"  # container_path: field 1, LEN 0x0a; len 6
        b"\x12\x06/dev/y"  # host_path: field 2, LEN 0x12; len 6
        b"\x1a\x03rwm",  # permissions: field 3, LEN 0x1a; len 3
        id="v1beta1.DeviceSpec",
    ),
    # ---------------------------------------------------------------- pluginregistration (v1)
    pytest.param(
        "pluginregistration.PluginInfo",
        {
            "type": "DevicePlugin",
            "name": "vendor.com/gpu",
            "endpoint": "/p.sock",
            "supported_versions": ["v1alpha", "v1beta1"],
        },
        b"\x0a\x0cDevicePlugin"  # type: field 1, LEN 0x0a; len 12 = 0x0c
        b"\x12\x0evendor.com/gpu"  # name: field 2, LEN 0x12; len 14 = 0x0e
        b"\x1a\x07/p.sock"  # endpoint: field 3, LEN 0x1a; len 7
        b"\x22\x07v1alpha"  # supported_versions[0]: field 4, LEN 0x22; len 7
        b"\x22\x07v1beta1",  # supported_versions[1]
        id="pluginregistration.PluginInfo",
    ),
    pytest.param(
        "pluginregistration.RegistrationStatus",
        {"plugin_registered": True},
        b"\x08\x01",  # plugin_registered (bool): field 1, VARINT 0x08; true; error "" is not written
        id="pluginregistration.RegistrationStatus-registered",
    ),
    pytest.param(
        "pluginregistration.RegistrationStatus",
        {"plugin_registered": True, "error": "bad"},
        b"\x08\x01"  # plugin_registered: field 1, VARINT 0x08; true
        b"\x12\x03bad",  # error: field 2, LEN 0x12; len 3
        id="pluginregistration.RegistrationStatus-both-fields",
    ),
    pytest.param(
        "pluginregistration.RegistrationStatusResponse",
        {},
        b"",
        id="pluginregistration.RegistrationStatusResponse",
    ),
    pytest.param("pluginregistration.InfoRequest", {}, b"", id="pluginregistration.InfoRequest"),
    # ---------------------------------------------------------------- podresources v1
    pytest.param("v1.AllocatableResourcesRequest", {}, b"", id="v1.AllocatableResourcesRequest"),
    pytest.param("v1.ListPodResourcesRequest", {}, b"", id="v1.ListPodResourcesRequest"),
    pytest.param(
        "v1.AllocatableResourcesResponse",
        {
            "devices": [{"resource_name": "r", "device_ids": ["d0"]}],
            "cpu_ids": [0, 1, 2, 3],
            "memory": [{"memory_type": "memory", "size": 1024}],
        },
        b"\x0a\x07"  # devices[0]: field 1, LEN 0x0a; len 3 + 4 = 7
        b"\x0a\x01r\x12\x02d0"  # ContainerDevices{resource_name 0x0a "r", device_ids 0x12 "d0"}
        b"\x12\x04\x00\x01\x02\x03"  # cpu_ids PACKED: field 2, LEN (2 << 3) | 2 = 0x12; len 4; 0 1 2 3
        b"\x1a\x0b"  # memory[0]: field 3, LEN 0x1a; len 8 + 3 = 11 = 0x0b
        b"\x0a\x06memory"  # ContainerMemory.memory_type: field 1, LEN 0x0a; len 6
        b"\x10\x80\x08",  # ContainerMemory.size: field 2, VARINT 0x10; 1024: 0x00 | 0x80, 1024 >> 7 = 8
        id="v1.AllocatableResourcesResponse-packed-cpu-ids",
    ),
    pytest.param(
        "v1.ListPodResourcesResponse",
        {"pod_resources": [{"name": "p", "namespace": "ns"}, {"name": "q"}]},
        b"\x0a\x07"  # pod_resources[0]: field 1, LEN 0x0a; len 3 + 4 = 7
        b"\x0a\x01p\x12\x02ns"  # PodResources{name 0x0a "p", namespace 0x12 "ns"}
        b"\x0a\x03"  # pod_resources[1]: field 1, LEN; len 3
        b"\x0a\x01q",  # PodResources{name "q"}
        id="v1.ListPodResourcesResponse",
    ),
    pytest.param(
        "v1.PodResources",
        {"name": "p", "namespace": "ns", "containers": [{"name": "c"}]},
        b"\x0a\x01p"  # name: field 1, LEN 0x0a; len 1
        b"\x12\x02ns"  # namespace: field 2, LEN 0x12; len 2
        b"\x1a\x03"  # containers[0]: field 3, LEN 0x1a; len 3
        b"\x0a\x01c",  # ContainerResources.name: field 1, LEN 0x0a; len 1
        id="v1.PodResources",
    ),
    pytest.param(
        "v1.ContainerResources",
        {
            "name": "c",
            "devices": [{"resource_name": "r", "device_ids": ["d0"]}],
            "cpu_ids": [2, 300],
            "memory": [{"memory_type": "hugepages-2Mi", "size": 2097152}],
            "dynamic_resources": [
                {"claim_name": "cl", "claim_namespace": "ns", "claim_resources": [{"driver_name": "drv"}]}
            ],
        },
        b"\x0a\x01c"  # name: field 1, LEN 0x0a; len 1
        b"\x12\x07\x0a\x01r\x12\x02d0"  # devices[0]: field 2, LEN 0x12; len 7 = ContainerDevices{"r", ["d0"]}
        b"\x1a\x03\x02\xac\x02"  # cpu_ids PACKED: field 3, LEN (3 << 3) | 2 = 0x1a; len 3; 2, 300 = ac 02
        b"\x22\x14"  # memory[0]: field 4, LEN 0x22; len 15 + 5 = 20 = 0x14
        b"\x0a\x0dhugepages-2Mi"  # ContainerMemory.memory_type: field 1, LEN 0x0a; len 13 = 0x0d
        b"\x10\x80\x80\x80\x01"  # ContainerMemory.size: field 2, VARINT 0x10; 2**21: 3 empty groups, 1
        b"\x2a\x0f"  # dynamic_resources[0]: field 5, LEN: (5 << 3) | 2 = 0x2a; len 4 + 4 + 7 = 15 = 0x0f
        b"\x12\x02cl"  # DynamicResource.claim_name: field 2, LEN 0x12 (field 1 no longer exists)
        b"\x1a\x02ns"  # DynamicResource.claim_namespace: field 3, LEN 0x1a
        b"\x22\x05"  # DynamicResource.claim_resources[0]: field 4, LEN 0x22; len 5
        b"\x12\x03drv",  # ClaimResource.driver_name: field 2, LEN 0x12; len 3
        id="v1.ContainerResources-all-fields",
    ),
    pytest.param(
        "v1.ContainerMemory",
        {"memory_type": "memory", "size": 17179869184, "topology": {"nodes": [{"ID": 1}]}},
        b"\x0a\x06memory"  # memory_type: field 1, LEN 0x0a; len 6
        b"\x10\x80\x80\x80\x80\x40"  # size (uint64): field 2, VARINT 0x10; 2**34: 4 empty groups, 0x40
        b"\x1a\x04\x0a\x02\x08\x01",  # topology: field 3, LEN 0x1a; len 4 = {nodes: [NUMANode{ID: 1}]}
        id="v1.ContainerMemory",
    ),
    pytest.param(
        "v1.ContainerMemory",
        {"size": 18446744073709551615},
        b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # uint64 max 2**64 - 1: nine 0xff, then 0x01
        id="v1.ContainerMemory-uint64-max",
    ),
    pytest.param(
        "v1.ContainerDevices",
        {
            "resource_name": "vendor.com/gpu",
            "device_ids": ["d0", "d1"],
            "topology": {"nodes": [{}, {"ID": 1}]},
        },
        b"\x0a\x0evendor.com/gpu"  # resource_name: field 1, LEN 0x0a; len 14
        b"\x12\x02d0\x12\x02d1"  # device_ids: field 2, LEN 0x12, per element
        b"\x1a\x06"  # topology: field 3, LEN 0x1a; len 2 + 4 = 6
        b"\x0a\x00"  # nodes[0] = NUMANode{ID: 0}: empty record
        b"\x0a\x02\x08\x01",  # nodes[1] = NUMANode{ID: 1}
        id="v1.ContainerDevices",
    ),
    pytest.param(
        "v1.TopologyInfo",
        {"nodes": [{"ID": 1}, {"ID": 2}]},
        b"\x0a\x02\x08\x01"  # nodes[0]: field 1, LEN 0x0a; len 2 = NUMANode{ID (0x08): 1}
        b"\x0a\x02\x08\x02",  # nodes[1]: NUMANode{ID: 2}
        id="v1.TopologyInfo",
    ),
    pytest.param(
        "v1.NUMANode",
        {"ID": 1},
        b"\x08\x01",  # ID: field 1, VARINT: (1 << 3) | 0 = 0x08; 1
        id="v1.NUMANode-1",
    ),
    pytest.param(
        "v1.NUMANode",
        {"ID": 4294967296},
        b"\x08\x80\x80\x80\x80\x10",  # 2**32: four empty 7-bit groups, then 2**(32-28) = 0x10
        id="v1.NUMANode-4294967296-above-int32",
    ),
    pytest.param(
        "v1.NUMANode",
        {"ID": -1},
        b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # -1 sign-extended to 64 bits: 10-byte varint
        id="v1.NUMANode-negative-10-byte-varint",
    ),
    pytest.param(
        "v1.DynamicResource",
        {
            "claim_name": "claim",
            "claim_namespace": "default",
            "claim_resources": [
                {
                    "cdi_devices": [{"name": "v.com/g=0"}],
                    "driver_name": "gpu.example.com",
                    "pool_name": "node-a",
                    "device_name": "gpu-0",
                }
            ],
        },
        b"\x12\x05claim"  # claim_name: field 2, LEN: (2 << 3) | 2 = 0x12; len 5 (field 1 is a tombstone)
        b"\x1a\x07default"  # claim_namespace: field 3, LEN 0x1a; len 7
        b"\x22\x2d"  # claim_resources[0]: field 4, LEN 0x22; len 13 + 17 + 8 + 7 = 45 = 0x2d
        b"\x0a\x0b\x0a\x09v.com/g=0"  # ClaimResource.cdi_devices[0]: field 1, LEN 0x0a; len 11
        b"\x12\x0fgpu.example.com"  # ClaimResource.driver_name: field 2, LEN 0x12; len 15 = 0x0f
        b"\x1a\x06node-a"  # ClaimResource.pool_name: field 3, LEN 0x1a; len 6
        b"\x22\x05gpu-0",  # ClaimResource.device_name: field 4, LEN 0x22; len 5
        id="v1.DynamicResource",
    ),
    pytest.param(
        "v1.ClaimResource",
        {
            "cdi_devices": [{"name": "a"}, {"name": "b"}],
            "driver_name": "d",
            "pool_name": "p",
            "device_name": "x",
        },
        b"\x0a\x03\x0a\x01a"  # cdi_devices[0]: field 1, LEN 0x0a; len 3 = CDIDevice{name (0x0a): "a"}
        b"\x0a\x03\x0a\x01b"  # cdi_devices[1]
        b"\x12\x01d"  # driver_name: field 2, LEN 0x12; len 1
        b"\x1a\x01p"  # pool_name: field 3, LEN 0x1a; len 1
        b"\x22\x01x",  # device_name: field 4, LEN 0x22; len 1
        id="v1.ClaimResource",
    ),
    pytest.param(
        "v1.CDIDevice",
        {"name": "vendor.com/gpu=gpu0"},
        b"\x0a\x13vendor.com/gpu=gpu0",  # name: field 1, LEN 0x0a; len 19 = 0x13
        id="v1.CDIDevice",
    ),
    pytest.param(
        "v1.GetPodResourcesRequest",
        {"pod_name": "p", "pod_namespace": "ns"},
        b"\x0a\x01p"  # pod_name: field 1, LEN 0x0a; len 1
        b"\x12\x02ns",  # pod_namespace: field 2, LEN 0x12; len 2
        id="v1.GetPodResourcesRequest",
    ),
    pytest.param(
        "v1.GetPodResourcesResponse",
        {"pod_resources": {"name": "p", "namespace": "ns"}},
        b"\x0a\x07"  # pod_resources (singular message): field 1, LEN 0x0a; len 7
        b"\x0a\x01p\x12\x02ns",  # PodResources{name "p", namespace "ns"}
        id="v1.GetPodResourcesResponse",
    ),
    pytest.param(
        "v1.GetPodResourcesResponse",
        {"pod_resources": {}},
        b"\x0a\x00",  # a set but empty singular submessage is still written: field 1, LEN 0x0a; len 0
        id="v1.GetPodResourcesResponse-empty-submessage-is-present",
    ),
]

# Parse-only cases: bytes a conforming parser must accept although our serializer never
# writes them (it packs). Each case: message, expected values, accepted bytes, canonical bytes.
ACCEPTED_NON_CANONICAL = [
    pytest.param(
        "v1.AllocatableResourcesResponse",
        {"cpu_ids": [0, 1, 2, 3]},
        b"\x10\x00\x10\x01\x10\x02\x10\x03",  # UNPACKED: field 2, VARINT (2 << 3) | 0 = 0x10, per value
        b"\x12\x04\x00\x01\x02\x03",  # PACKED: field 2, LEN: (2 << 3) | 2 = 0x12; len 4
        id="v1.AllocatableResourcesResponse-unpacked-cpu-ids",
    ),
    pytest.param(
        "v1.ContainerResources",
        {"cpu_ids": [2, 300]},
        b"\x18\x02\x18\xac\x02",  # UNPACKED cpu_ids: field 3, VARINT: (3 << 3) | 0 = 0x18; 2, then 300
        b"\x1a\x03\x02\xac\x02",  # PACKED: field 3, LEN: (3 << 3) | 2 = 0x1a; len 3
        id="v1.ContainerResources-unpacked-cpu-ids",
    ),
    pytest.param(
        "v1.ContainerResources",
        {"cpu_ids": [2, 300, -1]},
        b"\x1a\x01\x02"  # packed chunk: field 3, LEN 0x1a; len 1; [2]
        b"\x18\xac\x02"  # unpacked element: field 3, VARINT 0x18; 300
        b"\x1a\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # packed chunk: len 10; [-1] as 10-byte varint
        b"\x1a\x0d\x02\xac\x02\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # packed: len 1 + 2 + 10 = 13
        id="v1.ContainerResources-packed-and-unpacked-chunks-concatenate",
    ),
]

# Literals used above, restated for the independent cross-check below.
VARINT_LITERALS = [
    pytest.param(0, b"\x00", id="0"),
    pytest.param(1, b"\x01", id="1"),
    pytest.param(300, b"\xac\x02", id="300"),
    pytest.param(1024, b"\x80\x08", id="1024"),
    pytest.param(2**21, b"\x80\x80\x80\x01", id="2**21"),
    pytest.param(2**31 - 1, b"\xff\xff\xff\xff\x07", id="int32-max"),
    pytest.param(2**32, b"\x80\x80\x80\x80\x10", id="2**32"),
    pytest.param(2**34, b"\x80\x80\x80\x80\x40", id="2**34"),
    pytest.param(2**63 - 1, b"\xff\xff\xff\xff\xff\xff\xff\xff\x7f", id="int64-max"),
    pytest.param(-1, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", id="-1"),
    pytest.param(-(2**63), b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", id="int64-min"),
    pytest.param(2**64 - 1, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", id="uint64-max"),
]

TAG_LITERALS = [
    pytest.param(1, 0, b"\x08", id="field1-varint"),
    pytest.param(2, 0, b"\x10", id="field2-varint"),
    pytest.param(3, 0, b"\x18", id="field3-varint"),
    pytest.param(1, 2, b"\x0a", id="field1-len"),
    pytest.param(2, 2, b"\x12", id="field2-len"),
    pytest.param(3, 2, b"\x1a", id="field3-len"),
    pytest.param(4, 2, b"\x22", id="field4-len"),
    pytest.param(5, 2, b"\x2a", id="field5-len"),
]


def _message(full_name: str, values: dict[str, Any]) -> Message:
    """Build the generated message `package.Name` from plain values, inside the test, not at import."""
    package, name = full_name.rsplit(".", 1)
    module = MODULES[package]
    assert name in module.DESCRIPTOR.message_types_by_name, f"{full_name} is not in the generated code"
    message: Message = getattr(module, name)(**values)
    assert message.DESCRIPTOR.full_name == full_name, "the generated message has another wire name"
    return message


def _unknown(message: Message) -> list[tuple[int, int, Any]]:
    """(field number, wire type, data) of each unknown field directly in `message`."""
    fields = UnknownFieldSet(message)
    return [(fields[i].field_number, fields[i].wire_type, fields[i].data) for i in range(len(fields))]


def _submessages(fd: FieldDescriptor, value: Any) -> list[Message]:
    """The submessages a set field holds; none for scalars and maps (whose values are strings here)."""
    if fd.message_type is None or fd.message_type.GetOptions().map_entry:
        return []
    return list(value) if fd.is_repeated else [value]


def _text(message: Message) -> str:
    return text_format.MessageToString(message, as_one_line=True) or "<empty>"


def _unknown_fields(message: Message, path: str = "") -> list[str]:
    """Field numbers the generated class did not recognise, anywhere in the tree."""
    path = path or message.DESCRIPTOR.name
    found = [
        f"{path}: unknown field {number} (wire type {wire_type})"
        for number, wire_type, _ in _unknown(message)
    ]
    for fd, value in message.ListFields():
        for i, child in enumerate(_submessages(fd, value)):
            found += _unknown_fields(child, f"{path}.{fd.name}[{i}]")
    return found


def _set_fields(message: Message, seen: set[str]) -> None:
    """Record the full name of every field holding a non-default value, recursing into submessages."""
    for fd, value in message.ListFields():
        seen.add(fd.full_name)
        for child in _submessages(fd, value):
            _set_fields(child, seen)


def _independent_varint(value: int) -> bytes:
    """Base-128 varint of value as a 64-bit two's complement integer (the int32/int64/uint64 encoding)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@pytest.mark.parametrize(("message", "values", "wire"), GOLDEN)
def test_hand_written_bytes_parse_to_the_expected_values(
    message: str, values: dict[str, Any], wire: bytes
) -> None:
    """Guards what we read from the kubelet: its bytes land in the right fields with the right values."""
    expected = _message(message, values)
    parsed = type(expected).FromString(wire)
    assert _unknown_fields(parsed) == [], "bytes went to field numbers our descriptor does not declare"
    assert parsed == expected, f"parsed {_text(parsed)!r}, expected {_text(expected)!r}"


@pytest.mark.parametrize(("message", "values", "wire"), GOLDEN)
def test_expected_values_serialize_to_exactly_the_hand_written_bytes(
    message: str, values: dict[str, Any], wire: bytes
) -> None:
    """Guards what we send to the kubelet: byte-for-byte the upstream encoding (maps sorted by key)."""
    serialized = _message(message, values).SerializeToString(deterministic=True)
    assert serialized.hex(" ") == wire.hex(" ")


@pytest.mark.parametrize(("message", "values", "accepted", "canonical"), ACCEPTED_NON_CANONICAL)
def test_parser_accepts_unpacked_repeated_scalars(
    message: str, values: dict[str, Any], accepted: bytes, canonical: bytes
) -> None:
    """Guards interop with senders that do not pack repeated int64 (allowed by the proto3 spec)."""
    expected = _message(message, values)
    parsed = type(expected).FromString(accepted)
    assert parsed == expected, f"parsed {_text(parsed)!r}, expected {_text(expected)!r}"
    assert parsed.SerializeToString(deterministic=True).hex(" ") == canonical.hex(" ")


def test_removed_dynamic_resource_field_1_is_kept_out_of_every_known_field() -> None:
    """Guards the upstream tombstone: an old sender's class_name (field 1) must not be read as any field."""
    wire = (
        b"\x0a\x03gpu"  # removed class_name: field 1, LEN: (1 << 3) | 2 = 0x0a; len 3
        b"\x12\x02cl"  # claim_name: field 2, LEN 0x12; len 2
    )
    parsed = pr.DynamicResource.FromString(wire)
    assert [(fd.name, value) for fd, value in parsed.ListFields()] == [("claim_name", "cl")]
    assert _unknown(parsed) == [(1, 2, b"gpu")]


def test_every_message_of_every_api_has_its_own_golden_case() -> None:
    """Guards completeness: a message added to a proto without a golden case fails here."""
    covered = {param.values[0] for param in GOLDEN}
    declared = {
        descriptor.full_name
        for module in MODULES.values()
        for descriptor in module.DESCRIPTOR.message_types_by_name.values()
    }
    assert sorted(declared - covered) == []


def test_every_field_of_every_message_holds_a_non_default_value_in_some_golden_case() -> None:
    """Guards completeness per field: each field's tag and encoding is exercised at least once."""
    seen: set[str] = set()
    for param in GOLDEN:
        name, values, _ = param.values
        assert isinstance(name, str) and isinstance(values, dict)
        _set_fields(_message(name, values), seen)
    declared = {
        fd.full_name
        for module in MODULES.values()
        for descriptor in module.DESCRIPTOR.message_types_by_name.values()
        for fd in descriptor.fields
    }
    assert sorted(declared - seen) == []


def test_golden_case_ids_are_unique() -> None:
    """Guards against a copy-pasted case silently shadowing another in reports."""
    ids = [str(param.id) for param in GOLDEN + ACCEPTED_NON_CANONICAL]
    assert sorted({i for i in ids if ids.count(i) > 1}) == []


@pytest.mark.parametrize(("value", "literal"), VARINT_LITERALS)
def test_varint_literals_match_an_independent_encoder(value: int, literal: bytes) -> None:
    """Guards the hand arithmetic behind the integer literals above (cross-check only)."""
    assert _independent_varint(value).hex(" ") == literal.hex(" ")


@pytest.mark.parametrize(("field_number", "wire_type", "literal"), TAG_LITERALS)
def test_tag_literals_are_field_number_shifted_by_three_or_wire_type(
    field_number: int, wire_type: int, literal: bytes
) -> None:
    """Guards the hand arithmetic behind every tag byte above: (field_number << 3) | wire_type."""
    assert _independent_varint((field_number << 3) | wire_type) == literal

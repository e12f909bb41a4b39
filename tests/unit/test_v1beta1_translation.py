"""v1beta1 <-> model translation: pure functions, checked with tables of cases."""

from __future__ import annotations

import pytest

from shim.deviceplugin import common, v1beta1
from shim.generated.v1beta1 import api_pb2 as pb
from shim.model import (
    Capabilities,
    ContainerAllocateRequest,
    ContainerGrant,
    Device,
    DeviceNode,
    Health,
    Mount,
    PreferredAllocationRequest,
)


@pytest.mark.parametrize(
    ("caps", "expected"),
    [
        (Capabilities(), pb.DevicePluginOptions()),
        (
            Capabilities(preferred_allocation=True),
            pb.DevicePluginOptions(get_preferred_allocation_available=True),
        ),
        (Capabilities(pre_start=True), pb.DevicePluginOptions(pre_start_required=True)),
    ],
    ids=["none", "preferred", "prestart"],
)
def test_capabilities_become_plugin_options(caps: Capabilities, expected: pb.DevicePluginOptions) -> None:
    """Each capability maps to exactly its DevicePluginOptions flag."""
    assert v1beta1.options_from_model(caps) == expected


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (Device("a"), pb.Device(ID="a", health="Healthy")),
        (Device("b", Health.UNHEALTHY), pb.Device(ID="b", health="Unhealthy")),
        (
            Device("c", Health.HEALTHY, (0, 1)),
            pb.Device(
                ID="c",
                health="Healthy",
                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0), pb.NUMANode(ID=1)]),
            ),
        ),
    ],
    ids=["healthy", "unhealthy", "numa"],
)
def test_devices_carry_exact_health_strings_and_topology(device: Device, expected: pb.Device) -> None:
    """Health is exactly Healthy/Unhealthy; topology only when NUMA nodes are known."""
    message = common.device_from_model(pb, device)
    assert message == expected
    assert message.HasField("topology") == bool(device.numa_nodes)


def test_allocate_requests_keep_container_order() -> None:
    """Each ContainerAllocateRequest becomes one model request, in order."""
    request = pb.AllocateRequest(
        container_requests=[
            pb.ContainerAllocateRequest(devices_ids=["a"]),
            pb.ContainerAllocateRequest(devices_ids=["b", "c"]),
        ]
    )
    assert common.allocate_request_to_model(request) == [
        ContainerAllocateRequest(("a",)),
        ContainerAllocateRequest(("b", "c")),
    ]


def test_a_grant_fills_every_response_field() -> None:
    """envs, mounts, device specs, annotations and CDI devices all reach the kubelet."""
    grant = ContainerGrant(
        envs={"A": "1"},
        mounts=(Mount("/c", "/h", True),),
        device_nodes=(DeviceNode("/dev/c", "/dev/h", "rwm"),),
        annotations={"k": "v"},
        cdi_devices=("example.com/foo=a",),
    )
    assert common.grant_from_model(pb, grant) == pb.ContainerAllocateResponse(
        envs={"A": "1"},
        mounts=[pb.Mount(container_path="/c", host_path="/h", read_only=True)],
        devices=[pb.DeviceSpec(container_path="/dev/c", host_path="/dev/h", permissions="rwm")],
        annotations={"k": "v"},
        cdi_devices=[pb.CDIDevice(name="example.com/foo=a")],
    )


def test_preferred_allocation_requests_and_answers_translate() -> None:
    """available/must-include/size come in per container; chosen IDs go back per container."""
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=["a", "b"], must_include_deviceIDs=["b"], allocation_size=1
            )
        ]
    )
    assert common.preferred_request_to_model(request) == [PreferredAllocationRequest(("a", "b"), ("b",), 1)]
    response = common.preferred_response_from_model(pb, [("b",)])
    assert [list(c.deviceIDs) for c in response.container_responses] == [["b"]]

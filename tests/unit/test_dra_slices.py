"""DRA device names and the slices of a pool, in each resource.k8s.io version (shim/dra)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shim.dra.names import device_name
from shim.dra.slices import MAX_DEVICES_PER_SLICE, NameCollision, Pool, slice_object, spec, spec_hash
from shim.model import Attribute, AttributeKind, Device, Health
from shim.names import driver_name_problem, node_name_problem

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
GPU = Device(
    "GPU-5d2c",
    attributes=(
        ("cores", Attribute(AttributeKind.INT, 108)),
        ("model", Attribute(AttributeKind.STRING, "A100")),
    ),
    capacity=(("memory", "80Gi"),),
)


@pytest.mark.parametrize("device_id", ["gpu-0", "sim0", "0", "a" * 63])
def test_an_id_that_is_a_dns_label_is_its_own_name(device_id: str) -> None:
    assert device_name(device_id) == device_id


@pytest.mark.parametrize(
    ("device_id", "stem"),
    [
        ("GPU-5d2c", "gpu-5d2c"),
        ("sim_0", "sim-0"),
        ("nvidia0/mig-1g.5gb", "nvidia0-mig-1g-5gb"),
        ("-lead", "lead"),
        ("___", "device"),
        ("a" * 64, "a" * 54),
    ],
)
def test_any_other_id_is_lowercased_dashed_and_hashed(device_id: str, stem: str) -> None:
    name = device_name(device_id)
    assert re.fullmatch(rf"{re.escape(stem)}-[0-9a-f]{{8}}", name), name
    assert device_name(device_id) == name  # the same ID, the same name


def test_ids_that_differ_only_in_case_keep_apart() -> None:
    assert device_name("GPU-a") != device_name("gpu-A") != device_name("gpu-a")


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=200))
def test_every_id_maps_to_a_dns_label(device_id: str) -> None:
    name = device_name(device_id)
    assert len(name) <= 63 and DNS_LABEL.fullmatch(name), name


def test_two_ids_meeting_in_one_name_are_refused_naming_both() -> None:
    taken = device_name("GPU_0")  # gpu-0-<hash>, itself a DNS label, so another ID may be it
    with pytest.raises(NameCollision, match=rf"'GPU_0', '{taken}' -> '{taken}'"):
        Pool.of("gpu.example.com", "node-a", [Device("GPU_0"), Device(taken)])


def test_a_pool_splits_at_the_per_slice_limit_and_an_empty_pool_is_one_empty_slice() -> None:
    pool = Pool.of("gpu.example.com", "node-a", [Device(f"d{i}") for i in range(300)])
    assert [len(c) for c in pool.chunks()] == [MAX_DEVICES_PER_SLICE, MAX_DEVICES_PER_SLICE, 44]
    assert Pool.of("gpu.example.com", "node-a", []).chunks() == [()]


def test_devices_are_ordered_by_name_whatever_the_drivers_order() -> None:
    pool = Pool.of("gpu.example.com", "node-a", [Device("b"), Device("a"), Device("c")])
    assert [d.name for d in pool.devices] == ["a", "b", "c"]


EXPECTED_V1_DEVICE = {
    "name": device_name("GPU-5d2c"),
    "attributes": {"cores": {"int": 108}, "model": {"string": "A100"}},
    "capacity": {"memory": {"value": "80Gi"}},
}


@pytest.mark.parametrize(
    ("version", "device"),
    [
        ("v1", EXPECTED_V1_DEVICE),
        ("v1beta2", EXPECTED_V1_DEVICE),
        (
            "v1beta1",
            {
                "name": device_name("GPU-5d2c"),
                "basic": {
                    "attributes": {"cores": {"int": 108}, "model": {"string": "A100"}},
                    "capacity": {"memory": {"value": "80Gi"}},
                },
            },
        ),
        (
            "v1alpha3",
            {
                "name": device_name("GPU-5d2c"),
                "basic": {
                    "attributes": {"cores": {"int": 108}, "model": {"string": "A100"}},
                    "capacity": {"memory": "80Gi"},
                },
            },
        ),
    ],
)
def test_each_version_gets_its_own_shape(version: str, device: dict[str, object]) -> None:
    """k8s.io/api resource/<version>/types.go: attributes under `basic` before v1beta2, capacity a
    bare quantity in v1alpha3."""
    pool = Pool.of("gpu.example.com", "node-a", [GPU])
    assert spec(pool, pool.chunks()[0], 3, 1, version) == {
        "driver": "gpu.example.com",
        "pool": {"name": "node-a", "generation": 3, "resourceSliceCount": 1},
        "nodeName": "node-a",
        "devices": [device],
    }


def test_a_device_without_attributes_is_a_name_alone_or_an_empty_basic() -> None:
    pool = Pool.of("gpu.example.com", "node-a", [Device("d0")])
    assert spec(pool, pool.chunks()[0], 1, 1, "v1")["devices"] == [{"name": "d0"}]
    assert spec(pool, pool.chunks()[0], 1, 1, "v1beta1")["devices"] == [{"name": "d0", "basic": {}}]


def test_a_device_on_one_numa_node_carries_the_standard_attribute() -> None:
    """resource.kubernetes.io/numaNode (an int: deviceattribute, 1.37), the one fact a legacy
    plugin gives beyond the ID; not for a device on several nodes (which is the physical one is not
    known), nor over the per-device limit, nor over what the driver said itself."""
    many = tuple((f"a{i:02}", Attribute(AttributeKind.INT, i)) for i in range(32))
    own = (("resource.kubernetes.io/numaNode", Attribute(AttributeKind.INT, 7)),)
    devices = [
        Device("d0", numa_nodes=(1,)),
        Device("d1", numa_nodes=(0, 1)),
        Device("d2", numa_nodes=(0,), attributes=many),
        Device("d3", numa_nodes=(0,), attributes=own),
    ]
    pool = Pool.of("gpu.example.com", "node-a", devices)
    got = {d["name"]: d.get("attributes", {}) for d in spec(pool, pool.chunks()[0], 1, 1, "v1")["devices"]}
    assert got["d0"] == {"resource.kubernetes.io/numaNode": {"int": 1}}
    assert got["d1"] == {}
    assert len(got["d2"]) == 32 and "resource.kubernetes.io/numaNode" not in got["d2"]
    assert got["d3"] == {"resource.kubernetes.io/numaNode": {"int": 7}}


def test_the_content_hash_ignores_the_version_and_health_but_not_content_or_generation() -> None:
    pool = Pool.of("gpu.example.com", "node-a", [GPU])
    chunk = pool.chunks()[0]
    first = spec_hash(pool, chunk, 1, 1)
    sick = Pool.of("gpu.example.com", "node-a", [replace(GPU, health=Health.UNHEALTHY)])
    assert spec_hash(sick, sick.chunks()[0], 1, 1) == first
    assert spec_hash(pool, chunk, 2, 1) != first
    bigger = Pool.of("gpu.example.com", "node-a", [replace(GPU, capacity=(("memory", "96Gi"),))])
    assert spec_hash(bigger, bigger.chunks()[0], 1, 1) != first
    body = slice_object(pool, chunk, 1, 1, "v1beta2")
    assert body["apiVersion"] == "resource.k8s.io/v1beta2"
    assert body["metadata"]["annotations"] == {"devshim.dev/spec-hash": first}
    assert body["metadata"]["generateName"] == "node-a-gpu.example.com-"


@pytest.mark.parametrize("name", ["gpu.example.com", "a", "x" * 63])
def test_dra_driver_names_are_lowercase_dns_subdomains_of_63(name: str) -> None:
    assert driver_name_problem(name) is None


@pytest.mark.parametrize("name", ["GPU.example.com", "gpu_example", "x" * 64, "", ".a", "a..b"])
def test_other_driver_names_are_refused(name: str) -> None:
    assert "not a DRA driver name" in (driver_name_problem(name) or "")


def test_node_names_are_dns_subdomains() -> None:
    assert node_name_problem("node-a.example") is None
    assert node_name_problem("Node_A") is not None

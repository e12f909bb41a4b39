"""The driver protocol's JSON <-> model translation, and driver errors -> what the kubelet sees."""

from __future__ import annotations

import re
from typing import Any

import grpc
import pytest

from shim.driverhost import protocol
from shim.errors import grpc_status
from shim.jsonrpc import ConnectionClosed, ErrorCode, RemoteError
from shim.model import Attribute, AttributeKind, ContainerGrant, Device, DeviceNode, Health, Mount


def test_a_device_with_a_declared_grant_translates_fully() -> None:
    """Every field of Device and Grant reaches the model; permissions default to rw."""
    device, grant = protocol.device_from_json(
        {
            "id": "a",
            "health": "UNHEALTHY",
            "numa_nodes": [1],
            "grant": {
                "envs": {"A": "1"},
                "mounts": [{"container_path": "/c", "host_path": "/h", "read_only": True}],
                "device_nodes": [{"container_path": "/dev/c", "host_path": "/dev/h"}],
                "annotations": {"k": "v"},
                "cdi_devices": ["x.com/y=a"],
            },
        }
    )
    assert device == Device("a", Health.UNHEALTHY, (1,))
    assert grant == ContainerGrant(
        envs={"A": "1"},
        mounts=(Mount("/c", "/h", True),),
        device_nodes=(DeviceNode("/dev/c", "/dev/h", "rw"),),
        annotations={"k": "v"},
        cdi_devices=("x.com/y=a",),
    )


def test_lower_camel_case_names_are_accepted_as_the_proto3_json_mapping_requires() -> None:
    """numaNodes, readOnly and friends mean the same as their snake_case names."""
    device, grant = protocol.device_from_json(
        {
            "id": "b",
            "health": 1,
            "numaNodes": [0],
            "grant": {"deviceNodes": [{"containerPath": "/d", "hostPath": "/e"}]},
        }
    )
    assert device == Device("b", Health.HEALTHY, (0,))
    assert grant is not None and grant.device_nodes == (DeviceNode("/d", "/e", "rw"),)


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        pytest.param({"devices": [{"health": "HEALTHY"}]}, "non-empty string id", id="no-id"),
        pytest.param({"devices": [{"id": "a", "health": "OK"}]}, "HEALTHY or UNHEALTHY", id="bad-health"),
        pytest.param(
            {"devices": [{"id": "a", "health": 1, "numa_nodes": [-1]}]}, "numa_nodes", id="neg-numa"
        ),
        # sysfs's "no node" (-1) read as uint64; one past Linux's MAX_NUMNODES; JSON's true.
        pytest.param(
            {"devices": [{"id": "a", "health": 1, "numa_nodes": [0, 2**64 - 1]}]},
            "'a': numa_nodes must be integers from 0 to 1023, not 18446744073709551615",
            id="uint64-numa",
        ),
        pytest.param(
            {"devices": [{"id": "a", "health": 1, "numa_nodes": [1024]}]},
            "from 0 to 1023, not 1024",
            id="numa-1024",
        ),
        pytest.param(
            {"devices": [{"id": "a", "health": 1, "numa_nodes": [True]}]}, "integers", id="bool-numa"
        ),
        pytest.param({"devices": [{"id": "a", "health": 1}, {"id": "a", "health": 1}]}, "twice", id="dup"),
        pytest.param({"devices": "all"}, "must be a list", id="not-a-list"),
        pytest.param(
            {"devices": [{"id": "a", "health": 1, "grant": {"envs": {"A": 1}}}]}, "envs", id="env-int"
        ),
    ],
)
def test_a_malformed_device_list_is_refused_naming_the_problem(payload: Any, fragment: str) -> None:
    """Garbage from a driver never becomes a device; the error says what was wrong."""
    with pytest.raises(protocol.DriverProtocolError, match=fragment):
        protocol.devices_from_json(payload)


@pytest.mark.parametrize(
    ("version", "ok"), [("1.0.0", True), ("1.7.2", True), ("2.0.0", False), ("0.9", False), (None, False)]
)
def test_protocol_versions_must_share_the_major(version: Any, ok: bool) -> None:
    """semver: a driver of another major is refused with both versions named."""
    if ok:
        protocol.check_protocol_version(version)
    else:
        with pytest.raises(protocol.DriverProtocolError, match="majors must match"):
            protocol.check_protocol_version(version)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (RemoteError(ErrorCode.UNKNOWN_DEVICE, "x"), grpc.StatusCode.INVALID_ARGUMENT),
        (RemoteError(ErrorCode.DEVICE_UNHEALTHY, "x"), grpc.StatusCode.INVALID_ARGUMENT),
        (RemoteError(ErrorCode.INVALID_PARAMS, "x"), grpc.StatusCode.INVALID_ARGUMENT),
        (RemoteError(ErrorCode.UNKNOWN_RESOURCE, "x"), grpc.StatusCode.INVALID_ARGUMENT),
        (RemoteError(ErrorCode.UNAVAILABLE, "x"), grpc.StatusCode.UNAVAILABLE),
        (RemoteError(ErrorCode.INTERNAL_ERROR, "x"), grpc.StatusCode.INTERNAL),
        (RemoteError(-1, "vendor specific"), grpc.StatusCode.INTERNAL),
        (TimeoutError(), grpc.StatusCode.DEADLINE_EXCEEDED),
        (ConnectionClosed("gone"), grpc.StatusCode.UNAVAILABLE),
    ],
    ids=[
        "unknown-device",
        "unhealthy",
        "params",
        "resource",
        "busy",
        "internal",
        "other",
        "timeout",
        "exited",
    ],
)
def test_driver_errors_map_to_the_documented_grpc_status(
    error: BaseException, status: grpc.StatusCode
) -> None:
    """The table in docs/driver-protocol.md "Errors", and the message names driver and method."""
    code, message = grpc_status(protocol.error_for("sim", "allocate", error))
    assert code is status
    assert message.startswith("driver 'sim': allocate")


def test_allocate_must_answer_one_grant_per_container() -> None:
    """A short answer is a protocol error, never a silently misaligned grant."""
    with pytest.raises(protocol.DriverProtocolError, match="1 grants for 2 containers"):
        protocol.grants_from_json({"containers": [{}]}, 2)


def _one(**extra: Any) -> dict[str, Any]:
    return {"devices": [{"id": "GPU-1", "health": 1, **extra}]}


def test_attributes_and_capacity_arrive_typed_and_sorted_by_name() -> None:
    """Protocol 1.1: each attribute keeps its kind; an int64 written as digits (proto3 JSON) is an int."""
    attributes = {
        "model": {"string": "A100"},
        "gpu.example.com/cores": {"int": "108"},
        "ecc": {"bool": False},
        "driverVersion": {"version": "550.54.15"},
        "minus": {"int": -3},
    }
    [(device, _)] = protocol.devices_from_json(_one(attributes=attributes, capacity={"memory": "80Gi"}))
    assert device.attributes == (
        ("driverVersion", Attribute(AttributeKind.VERSION, "550.54.15")),
        ("ecc", Attribute(AttributeKind.BOOL, False)),
        ("gpu.example.com/cores", Attribute(AttributeKind.INT, 108)),
        ("minus", Attribute(AttributeKind.INT, -3)),
        ("model", Attribute(AttributeKind.STRING, "A100")),
    )
    assert device.capacity == (("memory", "80Gi"),)


def test_a_device_from_a_1_0_driver_has_no_attributes() -> None:
    [(device, _)] = protocol.devices_from_json(_one())
    assert device == Device("GPU-1", Health.HEALTHY)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        pytest.param({"attributes": {"1x": {"int": 1}}}, "'1x': the name must be a C identifier", id="name"),
        pytest.param({"attributes": {"a" * 33: {"int": 1}}}, "at most 32", id="name-33"),
        pytest.param({"attributes": {"A.com/x": {"int": 1}}}, "DNS subdomain", id="domain-upper"),
        pytest.param({"attributes": {"a/b/c": {"int": 1}}}, "DNS subdomain", id="two-slashes"),
        pytest.param({"attributes": {f"{'d' * 64}.com/x": {"int": 1}}}, "at most 63", id="domain-long"),
        pytest.param({"attributes": {"x": {"int": 1, "bool": True}}}, "exactly one", id="two-kinds"),
        pytest.param({"attributes": {"x": {}}}, "exactly one", id="no-kind"),
        pytest.param({"attributes": {"x": {"float": 1.5}}}, "'float' is not one of", id="float"),
        pytest.param({"attributes": {"x": {"int": True}}}, "64-bit integer", id="bool-as-int"),
        pytest.param({"attributes": {"x": {"int": 2**63}}}, "64-bit integer", id="int-65-bits"),
        pytest.param({"attributes": {"x": {"int": "9" * 400}}}, "64-bit integer", id="int-huge-text"),
        pytest.param({"attributes": {"x": {"bool": "yes"}}}, "true or false", id="bool-text"),
        pytest.param({"attributes": {"x": {"string": "s" * 65}}}, "at most 64", id="string-65"),
        pytest.param({"attributes": {"x": {"version": "1.2"}}}, "semantic version", id="version"),
        pytest.param({"attributes": ["x"]}, "attributes must be an object", id="attrs-list"),
        pytest.param({"capacity": {"memory": "-1Gi"}}, "not a quantity", id="negative"),
        pytest.param({"capacity": {"memory": "1Zi"}}, "not a quantity", id="suffix"),
        pytest.param({"capacity": {"memory": 80}}, "must be a string", id="number"),
        pytest.param({"capacity": {"memory": "1" * 65}}, "not a quantity", id="quantity-long"),
        pytest.param(
            {
                "attributes": {f"a{i}": {"int": i} for i in range(20)},
                "capacity": {f"c{i}": "1" for i in range(13)},
            },
            "33 attributes and capacities; DRA allows at most 32",
            id="33",
        ),
    ],
)
def test_dra_limits_are_checked_where_the_driver_hands_them_in(extra: dict[str, Any], fragment: str) -> None:
    """The API server's own rules, refused with the list and naming the device."""
    with pytest.raises(protocol.DriverProtocolError, match=f"device 'GPU-1': .*{re.escape(fragment)}"):
        protocol.devices_from_json(_one(**extra))

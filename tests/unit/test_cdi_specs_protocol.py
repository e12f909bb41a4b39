"""The CDI specs a driver ships in ``initialize`` (protocol 1.2), read by the driver host: CDI's
name rules (tags.cncf.io/container-device-interface pkg/parser), devshim's bounds, and edits
that can say nothing but envs, mounts and device nodes. Each refusal says what was wrong."""

from __future__ import annotations

from typing import Any

import pytest

from shim.cdi import spec_json
from shim.driverhost import protocol
from shim.driverhost.protocol import DriverProtocolError
from shim.driverprotocol import MAX_CDI_SPEC_DEVICES, MAX_CDI_SPECS, PROTOCOL_VERSION
from shim.model import ContainerGrant, DeviceNode


def initialized(specs: Any) -> protocol.Initialized:
    return protocol.initialize_result_from_json({"protocol_version": PROTOCOL_VERSION, "cdi_specs": specs})


def spec(kind: str = "example.com/fpga", *names: str, edits: Any = None) -> dict[str, Any]:
    edits = {"envs": {"FPGA": "1"}} if edits is None else edits
    return {"kind": kind, "devices": [{"name": n, "edits": edits} for n in names or ("fpga-0",)]}


def test_a_driver_of_protocol_1_1_ships_none() -> None:
    result = protocol.initialize_result_from_json({"protocol_version": "1.1.0", "resources": []})
    assert result.cdi_specs == ()


def test_a_shipped_spec_is_read_into_the_model_and_rendered_as_cdi_writes_it() -> None:
    edits = {
        "envs": {"FPGA": "0"},
        "device_nodes": [{"container_path": "/dev/f0", "host_path": "/dev/fpga0"}],
    }
    (read,) = initialized([spec("example.com/fpga", "fpga-0", "0:1", edits=edits)]).cdi_specs
    assert [d.name for d in read.devices] == ["fpga-0", "0:1"]
    assert read.devices[0].edits == ContainerGrant(
        envs={"FPGA": "0"}, device_nodes=(DeviceNode("/dev/f0", "/dev/fpga0", "rw"),)
    )
    rendered = spec_json(read)
    # A host path other than the container's, and a name starting with a digit: 0.5.0.
    assert rendered["cdiVersion"] == "0.5.0" and rendered["kind"] == "example.com/fpga"
    assert rendered["devices"][0]["containerEdits"] == {
        "env": ["FPGA=0"],
        "deviceNodes": [{"path": "/dev/f0", "permissions": "rw", "hostPath": "/dev/fpga0"}],
    }


def test_annotations_and_cdi_names_in_edits_are_not_carried() -> None:
    edits = {"envs": {"A": "1"}, "annotations": {"k": "v"}, "cdi_devices": ["nvidia.com/gpu=all"]}
    (read,) = initialized([spec(edits=edits)]).cdi_specs
    assert read.devices[0].edits == ContainerGrant(envs={"A": "1"})


@pytest.mark.parametrize(
    ("specs", "said"),
    [
        pytest.param({"kind": "x"}, "must be a list", id="not-a-list"),
        pytest.param([spec()] * 2, "a kind appears twice", id="kind-twice"),
        pytest.param([spec("example.com/fpga", "a", "a")], "a device name appears twice", id="name-twice"),
        pytest.param([spec("example.com")], "not a CDI kind", id="no-class"),
        pytest.param([spec("1vendor.com/x")], "must start with a letter", id="vendor-digit-first"),
        pytest.param([spec("example.com/x-")], "end with a letter or digit", id="class-dash-last"),
        pytest.param([spec("exa mple.com/x")], "hold only letters", id="space"),
        pytest.param([spec("example.com/x", "a/b")], "CDI device name", id="slash-in-name"),
        pytest.param([spec("example.com/x", "-a")], "CDI device name", id="dash-first"),
        pytest.param([spec("example.com/x", "gpu٣")], "CDI device name", id="non-ascii-digit"),
        pytest.param([{"kind": 7, "devices": []}], "must be a string", id="kind-number"),
        pytest.param(
            [{"kind": "example.com/x", "devices": []}], "devices must be a list of 1", id="no-devices"
        ),
        pytest.param([spec(edits={})], "no edits", id="no-edits"),
        pytest.param([spec(edits={"annotations": {"a": "b"}})], "no edits", id="only-annotations"),
        pytest.param([spec(edits=[1])], "edits must be an object", id="edits-list"),
        pytest.param([spec(f"example.com/k{i}") for i in range(MAX_CDI_SPECS + 1)], "at most 16", id="specs"),
        pytest.param(
            [spec("example.com/x", *(f"d{i}" for i in range(MAX_CDI_SPEC_DEVICES + 1)))],
            "more than 1024 devices over all specs",
            id="devices",
        ),
        pytest.param(
            [
                spec(f"example.com/k{k}", *(f"d{i}" for i in range(MAX_CDI_SPEC_DEVICES // 2 + 1)))
                for k in range(2)
            ],
            "more than 1024 devices over all specs",
            id="devices-over-specs",
        ),
    ],
)
def test_a_spec_devshim_cannot_write_is_refused_saying_why(specs: Any, said: str) -> None:
    with pytest.raises(DriverProtocolError, match=said):
        initialized(specs)

"""Digits that are not ASCII ("٣Gi", "1١.0.0": Arabic-Indic) in quantities, versions and integers,
which Python's \\d, str.isdigit and int() all take but the API server refuses: devshim refuses them
where they enter (a driver's message, the SDK, a driver's configuration) with a clear error,
instead of publishing a ResourceSlice the API server rejects (docs/reliability.md, "Attacks")."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from adapters.sim.config import ConfigError as SimConfigError
from adapters.sim.config import load_config
from shim.driverhost import protocol
from shim.driverprotocol import PROTOCOL_VERSION, quantity_problem, version_problem
from shim.sdk.config import attributes_from_json, capacity_from_json
from shim.sdk.errors import InvalidParams
from shim.sdk.server import check_protocol_version
from tests.support.driver_process import ROOT, SIM, running_sim

ARABIC_QUANTITIES = ["٣Gi", "1٥", "1.٥Gi", ".٥", "1e٣", "٨٠Gi"]
# Each passed \d: a lone "٣" never did, as semver's [1-9] must lead.
ARABIC_VERSIONS = ["1١.0.0", "1.1٠.0", "1.0.1٢", "1.0.0-١a", "1.0.0-rc.1٢"]
ARABIC_INTS = ["١٢", "-١٢", "1٢"]


@pytest.mark.parametrize("text", ARABIC_QUANTITIES)
def test_a_quantity_with_non_ascii_digits_is_not_a_quantity(text: str) -> None:
    """The rule itself: [0-9] only."""
    assert quantity_problem(text) == f"{text!r} is not a quantity such as 80Gi, 1500m or 4"
    assert quantity_problem(text.translate(str.maketrans("٠١٢٣٤٥٦٧٨٩", "0123456789"))) is None


@pytest.mark.parametrize("text", ARABIC_VERSIONS)
def test_a_version_with_non_ascii_digits_is_not_a_semantic_version(text: str) -> None:
    problem = version_problem(text)
    assert problem is not None and "is not a semantic version" in problem


def _device(
    attributes: dict[str, Any] | None = None, capacity: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"id": "gpu-0", "health": "HEALTHY", "attributes": attributes, "capacity": capacity}


@pytest.mark.parametrize("text", ARABIC_QUANTITIES)
def test_a_driver_listing_a_capacity_with_non_ascii_digits_is_refused_naming_device_and_capacity(
    text: str,
) -> None:
    """A driver's device list is where a capacity enters devshim: refused there, never published."""
    with pytest.raises(
        protocol.DriverProtocolError, match=r"device 'gpu-0': capacity 'memory': .* is not a quantity"
    ):
        protocol.devices_from_json({"devices": [_device(capacity={"memory": text})]})


@pytest.mark.parametrize("text", ARABIC_VERSIONS)
def test_a_driver_listing_a_version_attribute_with_non_ascii_digits_is_refused(text: str) -> None:
    with pytest.raises(
        protocol.DriverProtocolError, match="device 'gpu-0': attribute 'driverVersion': .* not a semantic"
    ):
        protocol.devices_from_json({"devices": [_device(attributes={"driverVersion": {"version": text}})]})


@pytest.mark.parametrize("text", [*ARABIC_INTS, "²", "--5"])
def test_a_driver_listing_an_int_attribute_in_non_ascii_digits_is_refused_not_converted(text: str) -> None:
    """int("١٢") is 12 in Python, and "²".isdigit() is true (int() then raises its own error):
    a proto3 JSON int64 is ASCII digits, so each is refused with the attribute's rule."""
    with pytest.raises(
        protocol.DriverProtocolError, match=r"attribute 'cores': int must be a 64-bit integer"
    ):
        protocol.devices_from_json({"devices": [_device(attributes={"cores": {"int": text}})]})


def test_ascii_ints_versions_and_quantities_from_a_driver_still_pass() -> None:
    ((device, _),) = protocol.devices_from_json(
        {
            "devices": [
                _device(
                    attributes={"cores": {"int": "-12"}, "v": {"version": "1.2.3-rc.1+b5"}},
                    capacity={"memory": "80Gi"},
                )
            ]
        }
    )
    assert dict(device.attributes)["cores"].value == -12 and device.capacity == (("memory", "80Gi"),)


@pytest.mark.parametrize("version", [*ARABIC_VERSIONS, "1.٣.0", "1.0", "1.x.y"])
def test_a_driver_answering_initialize_with_a_non_ascii_protocol_version_is_refused(version: str) -> None:
    """The driver's protocol version is semver in ASCII digits (docs/driver-protocol.md,
    "Lifecycle"); "1.٣.0" passed before, by its major alone."""
    with pytest.raises(protocol.DriverProtocolError, match="is not a semantic version.*majors must match"):
        protocol.check_protocol_version(version)


@pytest.mark.parametrize("version", ["1١.0.0", "1.1٠.0", "1.0.1٢"])
def test_the_sdk_refuses_a_devshim_protocol_version_with_non_ascii_digits(version: str) -> None:
    """The SDK's side of initialize: not semver, said as such (not "majors must be equal")."""
    with pytest.raises(InvalidParams, match="is not a semantic version"):
        check_protocol_version(version)


async def test_a_real_sdk_driver_answers_initialize_with_a_non_ascii_version_as_invalid_params(
    tmp_path: Any,
) -> None:
    """The simulator, a real SDK driver process, answers -32602 naming the version."""
    resource = {"name": "example.com/sim", "count": 1}
    async with running_sim({"resources": [resource]}, tmp_path) as sim:
        response = await sim.request(1, "initialize", {"protocol_version": "1.1٠.0"})
        assert response["error"]["code"] == -32602 and "1.1٠.0" in response["error"]["message"]
        response = await sim.request(2, "initialize", {"protocol_version": PROTOCOL_VERSION})
        assert response["result"]["protocol_version"] == PROTOCOL_VERSION


@pytest.mark.parametrize(
    ("attributes", "capacity"),
    [({}, {"memory": "٣Gi"}), ({"v": {"version": "1١.0.0"}}, {}), ({"n": {"int": "١٢"}}, {})],
)
def test_the_sdk_config_rules_refuse_non_ascii_digits(
    attributes: dict[str, Any], capacity: dict[str, Any]
) -> None:
    """What a driver written with the SDK checks its own configuration with."""
    with pytest.raises(ValueError, match="not a quantity|not a semantic version|64-bit integer"):
        attributes_from_json(attributes)
        capacity_from_json(capacity)


@pytest.mark.parametrize(
    "published",
    [
        {"capacity": {"memory": "٣Gi"}},
        {"attributes": {"driverVersion": {"version": "1١.0.0"}}},
        {"attributes": {"cores": {"int": "١٢"}}},
    ],
    ids=["quantity", "version", "int"],
)
def test_a_driver_config_with_non_ascii_digits_is_a_config_error_naming_the_field(
    published: dict[str, Any],
) -> None:
    """The simulator's configuration, where a person writes such a value: refused there."""
    config = {"resources": [{"name": "example.com/sim", "count": 1, **published}]}
    with pytest.raises(
        SimConfigError, match=r"resources\[0\]: .*(not a quantity|not a semantic version|64-bit)"
    ):
        load_config(inline_json=json.dumps(config))


def test_the_simulator_given_a_non_ascii_quantity_exits_2_naming_the_field() -> None:
    """The same through the simulator's own process: a clean exit 2, no traceback, no driver that
    half works."""
    config = {"resources": [{"name": "example.com/sim", "count": 1, "capacity": {"memory": "٣Gi"}}]}
    result = subprocess.run(
        [*SIM, "--config-json", json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stderr
    assert "resources[0]" in result.stderr and "'٣Gi' is not a quantity" in result.stderr
    assert "Traceback" not in result.stderr

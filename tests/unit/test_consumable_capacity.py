"""Consumable capacity (protocol 1.3): a device several claims share, each claim's share read from
the API server's allocation, held beside the others, kept across a restart, and published.

Facts from k8s.io/api resource/v1 types.go at 1.37: Device.allowMultipleAllocations (under `basic`
in v1beta1; none in v1alpha3), and an allocation result's shareID (a UID) and consumedCapacity
(capacity name to quantity)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from shim.core.holds import Holds
from shim.dra.checkpoint import Checkpoint, Entry, Group, PreparedDevice
from shim.dra.claims import ClaimProblem, ClaimRef, allocated
from shim.dra.slices import Pool, dropped, spec
from shim.driverhost import protocol
from shim.driverhost.protocol import DriverProtocolError
from shim.driverprotocol import quantity_value
from shim.errors import DeviceHeld
from shim.model import CapacityPolicy, Device, DeviceShare, Health

REF = ClaimRef("default", "c", "u-1")
D = "d.example.com"
SHARE_ID = "0c9a6b41-b1fd-4656-8cab-62e54a38ac08"


def claim_with(**result: Any) -> dict[str, Any]:
    base = {"request": "r", "driver": D, "pool": "n", "device": "gpu-0"}
    return {
        "metadata": {"uid": "u-1"},
        "status": {
            "allocation": {"devices": {"results": [base | result]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "p-1"}],
        },
    }


def test_a_results_share_is_read_with_its_capacity_sorted() -> None:
    [result] = allocated(
        claim_with(shareID=SHARE_ID, consumedCapacity={"memory": "8Gi", "cores": "2"}), REF, D, "n"
    )
    assert result.share == DeviceShare("gpu-0", SHARE_ID, (("cores", "2"), ("memory", "8Gi")))
    [plain] = allocated(claim_with(), REF, D, "n")
    assert plain.share is None


@pytest.mark.parametrize(
    ("result", "fragment"),
    [
        ({"shareID": 7}, "shareID '7', not a uid"),
        ({"shareID": "has space"}, "not a uid"),
        ({"shareID": SHARE_ID, "consumedCapacity": ["8Gi"]}, "consumedCapacity is not a map"),
        ({"shareID": SHARE_ID, "consumedCapacity": {"memory": "-1"}}, "is not a quantity"),
        ({"shareID": SHARE_ID, "consumedCapacity": {"1x": "1"}}, "C identifier"),
    ],
)
def test_a_share_the_api_server_could_not_have_written_is_refused(
    result: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ClaimProblem, match=fragment):
        allocated(claim_with(**result), REF, D, "n")


def test_a_device_says_whether_claims_may_share_it_and_the_host_sends_shares() -> None:
    device, _ = protocol.device_from_json(
        {"id": "g", "health": "HEALTHY", "allow_multiple_allocations": True}
    )
    assert device.allow_multiple_allocations
    with pytest.raises(DriverProtocolError, match="allow_multiple_allocations must be true or false"):
        protocol.device_from_json({"id": "g", "health": "HEALTHY", "allow_multiple_allocations": 1})
    assert protocol.resource_from_json({"name": "example.com/gpu", "shares": True}).capabilities.shares


def test_shares_hold_a_device_together_and_keep_a_whole_claim_and_the_device_plugin_out() -> None:
    holds = Holds("example.com/gpu")
    one, two, whole = "claim a/one (1)", "claim a/two (2)", "claim a/whole (3)"
    holds.check_for_claim(["g"], one, shared=True)
    assert holds.claim_prepared(["g"], one, shared=True)
    holds.check_for_claim(["g"], two, shared=True)  # another share: fine
    assert holds.claim_prepared(["g"], two, shared=True)
    with pytest.raises(DeviceHeld, match=r"held by shares of claim a/one \(1\) and 1 more through DRA"):
        holds.check_for_claim(["g"], whole)
    with pytest.raises(DeviceHeld, match="shares of claim a/one"):
        holds.check_for_plugin(["g"])
    assert [d.health for d in holds.for_plugin((Device("g"),))] == [Health.UNHEALTHY]
    assert holds.claim_freed(["g"], one) and holds.status()["dra"] == ["g"]
    assert holds.claim_freed(["g"], two) and holds.status()["dra"] == []
    holds.check_for_claim(["g"], whole)
    holds.claims_restored({}, {"g": {one}})  # as a restarted devshim's checkpoint has it
    with pytest.raises(DeviceHeld):
        holds.check_for_claim(["g"], whole)


async def test_the_checkpoint_keeps_a_share_and_its_answer(tmp_path: Path) -> None:
    share = DeviceShare("gpu-0", SHARE_ID, (("memory", "8Gi"),))
    groups = (Group("example.com/gpu", ("gpu-0",), shares=(share,)),)
    devices = (PreparedDevice(("r",), "n", "gpu-0", ("x/claim=u-1-0",), SHARE_ID),)
    checkpoint = Checkpoint(tmp_path, D)
    await checkpoint.put("u-1", Entry("default", "c", groups, devices))
    again = Checkpoint(tmp_path, D).get("u-1")
    assert again is not None and again.groups == groups and again.devices == devices
    written = json.loads(checkpoint.path.read_text())["claims"]["u-1"]
    assert written["devices"][0]["share_id"] == SHARE_ID
    # A claim without shares is written as an older devshim wrote it (the fields only where set).
    await checkpoint.put("u-2", Entry("default", "d", (Group("example.com/gpu", ("gpu-1",)),), ()))
    written = json.loads(checkpoint.path.read_text())["claims"]["u-2"]
    assert written["groups"] == [{"resource": "example.com/gpu", "device_ids": ["gpu-1"]}]
    assert written["devices"] == []


@pytest.mark.parametrize(
    ("version", "shown"), [("v1", True), ("v1beta2", True), ("v1beta1", True), ("v1alpha3", False)]
)
def test_a_shareable_device_is_published_so_where_the_version_has_the_field(
    version: str, shown: bool
) -> None:
    pool = Pool.of(D, "n", [Device("gpu-0", allow_multiple_allocations=True)])
    [device] = spec(pool, pool.chunks()[0], 1, 1, version)["devices"]
    described = device.get("basic", device)
    assert described.get("allowMultipleAllocations") is (True if shown else None)
    sent = spec(pool, pool.chunks()[0], 1, 1, "v1")
    assert dropped(sent, {**sent, "devices": [{"name": "gpu-0"}]}, "v1") == ["DRAConsumableCapacity"]


def _shared(policy: dict[str, Any]) -> dict[str, Any]:
    return {"allow_multiple_allocations": True, "capacity_policies": {"memory": policy}}


def test_a_capacitys_default_share_is_published_as_its_request_policy() -> None:
    """protocol 1.3's capacity_policies: a share asking for no memory takes 4Gi, not all 16Gi."""
    device, _ = protocol.device_from_json({
        "id": "gpu-0", "health": "HEALTHY", "allow_multiple_allocations": True,
        "capacity": {"memory": "16Gi"}, "capacity_policies": {"memory": {"default": "4Gi"}},
    })  # fmt: skip
    assert device.capacity_policies == (("memory", CapacityPolicy("4Gi")),)
    pool = Pool.of(D, "n", [device])
    [published] = spec(pool, pool.chunks()[0], 1, 1, "v1")["devices"]
    assert published["capacity"] == {"memory": {"value": "16Gi", "requestPolicy": {"default": "4Gi"}}}


def test_valid_values_and_a_range_are_published_in_the_request_policy() -> None:
    """protocol 1.4: the amounts a share may take, or their range, beside the default."""
    device, _ = protocol.device_from_json({
        "id": "gpu-0", "health": "HEALTHY", "allow_multiple_allocations": True,
        "capacity": {"memory": "16Gi", "cores": "8"},
        "capacity_policies": {
            "memory": {"default": "4Gi", "valid_values": ["2Gi", "4Gi", "8Gi"]},
            "cores": {"default": "2", "valid_range": {"min": "1", "max": "7", "step": "1"}},
        },
    })  # fmt: skip
    assert device.capacity_policies == (
        ("cores", CapacityPolicy("2", valid_range=("1", "7", "1"))),
        ("memory", CapacityPolicy("4Gi", valid_values=("2Gi", "4Gi", "8Gi"))),
    )
    pool = Pool.of(D, "n", [device])
    [published] = spec(pool, pool.chunks()[0], 1, 1, "v1")["devices"]
    assert published["capacity"] == {
        "memory": {
            "value": "16Gi",
            "requestPolicy": {"default": "4Gi", "validValues": ["2Gi", "4Gi", "8Gi"]},
        },
        "cores": {
            "value": "8",
            "requestPolicy": {"default": "2", "validRange": {"min": "1", "max": "7", "step": "1"}},
        },
    }
    minimal, _ = protocol.device_from_json({
        "id": "gpu-1", "health": "HEALTHY", "capacity": {"memory": "16Gi"},
        **_shared({"default": "4Gi", "valid_range": {"min": "1Gi"}}),
    })  # fmt: skip
    pool = Pool.of(D, "n", [minimal])
    [published] = spec(pool, pool.chunks()[0], 1, 1, "v1")["devices"]
    assert published["capacity"]["memory"]["requestPolicy"] == {
        "default": "4Gi",
        "validRange": {"min": "1Gi"},
    }


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"capacity_policies": {"memory": {"default": "4Gi"}}}, "need allow_multiple_allocations"),
        ({"allow_multiple_allocations": True, "capacity_policies": {"cores": {"default": "1"}}}, "not among"),
        (
            {"allow_multiple_allocations": True, "capacity_policies": {"memory": {"default": "17Gi"}}},
            "more than",
        ),
        (
            {"allow_multiple_allocations": True, "capacity_policies": {"memory": {"default": "lots"}}},
            "quantity",
        ),
        ({"allow_multiple_allocations": True, "capacity_policies": {"memory": {}}}, "must be a quantity"),
        # Protocol 1.4: valid values (at most 10, ascending, distinct in whole units, at most the
        # capacity, the default among them) or a range (min <= default <= max <= capacity; with a
        # step, whole numbers, min + step within the capacity, default and max on a step).
        (_shared({"default": "4Gi", "valid_values": ["4Gi"], "valid_range": {"min": "1Gi"}}), "not both"),
        (_shared({"default": "4Gi", "valid_values": ["8Gi", "4Gi"]}), "ascending"),
        (_shared({"default": "4Gi", "valid_values": ["4Gi", "32Gi"]}), "more than the capacity"),
        (_shared({"default": "4Gi", "valid_values": ["2Gi", "8Gi"]}), "must hold the default"),
        (_shared({"default": "1", "valid_values": ["100m", "1"]}), "holds one value twice"),
        (_shared({"default": "1Gi", "valid_values": [f"{n}Gi" for n in range(1, 12)]}), "at most 10"),
        (_shared({"default": "4Gi", "valid_values": "4Gi"}), "at most 10"),
        (_shared({"default": "4Gi", "valid_range": {"max": "8Gi"}}), "valid_range.min must be a quantity"),
        (_shared({"default": "1Gi", "valid_range": {"min": "2Gi"}}), "min 2Gi <= default 1Gi"),
        (_shared({"default": "4Gi", "valid_range": {"min": "1Gi", "max": "2Gi"}}), "<= max 2Gi"),
        (_shared({"default": "4Gi", "valid_range": {"min": "1Gi", "max": "32Gi"}}), "<= the capacity"),
        (_shared({"default": "4Gi", "valid_range": {"min": "1Gi", "step": "0"}}), "whole numbers above 0"),
        (_shared({"default": "1", "valid_range": {"min": "500m", "step": "1"}}), "whole numbers above 0"),
        (_shared({"default": "4Gi", "valid_range": {"min": "1Gi", "step": "16Gi"}}), "min plus one step"),
        (_shared({"default": "4Gi", "valid_range": {"min": "1Gi", "step": "2Gi"}}), "min plus whole steps"),
        (
            _shared({"default": "3Gi", "valid_range": {"min": "1Gi", "max": "4Gi", "step": "2Gi"}}),
            "whole steps",
        ),
        (_shared({"default": "4Gi", "valid_range": ["1Gi"]}), "must be an object"),
    ],
)
def test_a_request_policy_the_api_server_would_refuse_refuses_the_list(
    extra: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(DriverProtocolError, match=fragment):
        protocol.device_from_json(
            {"id": "gpu-0", "health": "HEALTHY", "capacity": {"memory": "16Gi"}, **extra}
        )


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1), ("5.", 5), (".5", Fraction(1, 2)), ("80Gi", 80 * 2**30), ("1500m", Fraction(3, 2)),
     ("1E", 10**18), ("1Ei", 2**60), ("1e3", 1000), ("2e-1", Fraction(1, 5)), ("+3k", 3000)],
)  # fmt: skip
def test_quantities_compare_by_their_exact_value(text: str, value: Fraction | int) -> None:
    assert quantity_value(text) == value

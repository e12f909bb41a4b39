"""Admin access (protocol 1.3) on the wire and in the checkpoint: what devshim sends a driver,
what it reads of a claim, and that a checkpoint without the field reads as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shim.dra.checkpoint import Checkpoint, Entry, Group
from shim.dra.claims import ClaimRef, allocated
from shim.driverhost import protocol
from shim.model import ContainerAllocateRequest

REF = ClaimRef("monitoring", "watcher", "u-1")
D = "d.example.com"


def test_only_an_admin_request_says_so_on_the_wire() -> None:
    requests = [ContainerAllocateRequest(("a",)), ContainerAllocateRequest(("b",), admin_access=True)]
    assert protocol.allocate_params("example.com/gpu", requests)["containers"] == [
        {"device_ids": ["a"]},
        {"device_ids": ["b"], "admin_access": True},
    ]


def test_a_resource_declares_admin_access_or_has_it_off() -> None:
    assert protocol.resource_from_json(
        {"name": "example.com/gpu", "admin_access": True}
    ).capabilities.admin_access
    assert not protocol.resource_from_json({"name": "example.com/gpu"}).capabilities.admin_access


def test_a_results_admin_access_is_read_only_when_true() -> None:
    claim = {
        "metadata": {"uid": "u-1"},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "r", "driver": D, "pool": "n", "device": "gpu-0", "adminAccess": True},
                {"request": "r", "driver": D, "pool": "n", "device": "gpu-1", "adminAccess": "yes"},
                {"request": "r", "driver": D, "pool": "n", "device": "gpu-2"},
            ]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "p-1"}],
        },
    }  # fmt: skip
    assert [a.admin_access for a in allocated(claim, REF, "d.example.com", "n")] == [True, False, False]


async def test_the_checkpoint_keeps_an_admin_group_and_reads_an_older_file(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path, "d.example.com")
    groups = (Group("example.com/gpu", ("gpu-0",)), Group("example.com/gpu", ("gpu-1",), admin_access=True))
    await checkpoint.put("u-1", Entry("monitoring", "watcher", groups, None))
    written = json.loads(checkpoint.path.read_text())["claims"]["u-1"]["groups"]
    assert written == [
        {"resource": "example.com/gpu", "device_ids": ["gpu-0"]},  # as an older devshim wrote it
        {"resource": "example.com/gpu", "device_ids": ["gpu-1"], "admin_access": True},
    ]
    again = Checkpoint(tmp_path, "d.example.com").get("u-1")
    assert again is not None and again.groups == groups


@pytest.mark.parametrize("value", [1, "true", None])
async def test_only_a_true_admin_access_in_the_file_counts(tmp_path: Path, value: object) -> None:
    checkpoint = Checkpoint(tmp_path, "d.example.com")
    await checkpoint.put(
        "u-1", Entry("ns", "c", (Group("example.com/gpu", ("gpu-0",), admin_access=True),), None)
    )
    body = json.loads(checkpoint.path.read_text())
    body["claims"]["u-1"]["groups"][0]["admin_access"] = value
    checkpoint.path.write_text(json.dumps(body))
    entry = Checkpoint(tmp_path, "d.example.com").get("u-1")
    assert entry is not None and entry.groups[0].admin_access is False

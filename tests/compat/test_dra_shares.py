"""Consumable capacity (resource.k8s.io allowMultipleAllocations, beta in 1.36): claims share one
device, each prepared as its share, none taking it from the others.

`devshim run` with a sim driver whose GPU allows multiple allocations (driver protocol 1.3:
``allow_multiple_allocations`` on the device, ``shares`` on the resource) against a real
kube-apiserver: the slice it publishes passes the server's validation, and claims allocated as the
scheduler leaves a shared device (each result with its shareID and consumedCapacity) are prepared
through devshim's DRA socket as the kubelet calls it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from tests.support.dra import Published, dra_status, make_claim, running_devshim
from tests.support.dra_calls import GPU, Devshim, pool_config, prepare, sim_driver, status_when, unprepare
from tests.support.unix import short_temp_dir

NODE = "node-shares"
SIM: dict[str, Any] = {
    "name": "example.com/gpu",
    "devices": [
        # A share asking for no memory takes 4Gi (the capacity's requestPolicy), not all 16Gi; it
        # may take 4, 8 or 16Gi, and 1 to 8 cores (protocol 1.4's valid values and range).
        {
            "id": "gpu-0",
            "allow_multiple_allocations": True,
            "capacity": {"cores": "8"},
            "capacity_policies": {
                "memory": {"default": "4Gi", "valid_values": ["4Gi", "8Gi", "16Gi"]},
                "cores": {"default": "1", "valid_range": {"min": "1", "max": "8", "step": "1"}},
            },
        },
        {"id": "gpu-1"},
    ],
    "capacity": {"memory": "16Gi"},
    "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
    "prestart": True,
    "deallocate": True,
    "shares": True,
}


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-share-") as path:
        yield path


@asynccontextmanager
async def devshim(folder: Path, plane: ControlPlane) -> AsyncIterator[Devshim]:
    config = pool_config(
        folder, plane, NODE, [sim_driver(folder, "gpus", SIM)], [{"name": GPU, "resources": [SIM["name"]]}]
    )
    async with running_devshim(config) as (proc, port):
        await dra_status(port, lambda s: s[GPU]["devices"] == 2, "the pool served")
        yield Devshim(folder, config, port, proc)


def share(memory: str) -> dict[str, Any]:
    return {"shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": memory}}


def held_by_dra(status: dict[str, Any]) -> list[str]:
    held: list[str] = status["resources"][SIM["name"]]["held"]["dra"]
    return held


async def test_two_claims_share_a_device_and_a_plain_claim_waits_for_both(
    plane: ControlPlane, folder: Path
) -> None:
    first, second = share("8Gi"), share("4Gi")
    one = make_claim(plane, "v1", "share-1", [("gpu", "gpu-0")], node=NODE, shared=first)
    two = make_claim(plane, "v1", "share-2", [("gpu", "gpu-0")], node=NODE, shared=second)
    rival = make_claim(plane, "v1", "whole", [("gpu", "gpu-0")], node=NODE)
    async with devshim(folder, plane) as shim:
        published = Published(plane, "v1", NODE)
        pool = await published.until(lambda p: len(p) == 2, "both GPUs")
        assert (
            pool["gpu-0"]["allowMultipleAllocations"] is True
            and "allowMultipleAllocations" not in pool["gpu-1"]
        )
        assert pool["gpu-0"]["capacity"] == {
            "memory": {
                "value": "16Gi",
                "requestPolicy": {"default": "4Gi", "validValues": ["4Gi", "8Gi", "16Gi"]},
            },
            "cores": {
                "value": "8",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "8", "step": "1"}},
            },
        }
        assert pool["gpu-1"]["capacity"] == {"memory": {"value": "16Gi"}}
        answers = await prepare(shim, [one, two])
        for claim, said in ((one, first), (two, second)):
            answer = answers[claim["metadata"]["uid"]]
            assert answer.error == ""
            [device] = answer.devices
            assert (device.device_name, device.share_id) == ("gpu-0", said["shareID"])
        # The driver heard each share (its share call), and no prestart: the device is not theirs alone.
        assert await shim.calls({"NodePrepareResources ok": 2}) == {"gpus allocate": 2}
        status = await status_when(shim.port, lambda s: s["dra"][GPU]["kubelet"]["prepared_claims"] == 2)
        assert held_by_dra(status) == ["gpu-0"]
        refused = (await prepare(shim, [rival]))[rival["metadata"]["uid"]].error
        assert "shares of claim default/share-1" in refused and "and 1 more through DRA" in refused
        # One share goes: the other still holds the device; nothing is deallocated.
        assert await unprepare(shim, [one]) == {one["metadata"]["uid"]: ""}
        status = await status_when(shim.port, lambda s: s["dra"][GPU]["kubelet"]["prepared_claims"] == 1)
        assert held_by_dra(status) == ["gpu-0"]
        assert await unprepare(shim, [two]) == {two["metadata"]["uid"]: ""}
        status = await status_when(shim.port, lambda s: s["dra"][GPU]["kubelet"]["prepared_claims"] == 0)
        assert held_by_dra(status) == []
        assert "gpus deallocate" not in await shim.calls({"NodeUnprepareResources ok": 2})
        assert (await prepare(shim, [rival]))[rival["metadata"]["uid"]].error == ""

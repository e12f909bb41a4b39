"""A claim whose devices come from two resources of one pool (issue 42, item 9): each device is
prepared by its own resource's driver and named by its own grant's CDI device, so a container
gets each driver's edits for that driver's device and nothing of the other's.

`devshim run` with two sim drivers and a real kube-apiserver (the claim is read from it), its
DRA socket dialled as the kubelet dials it. Before this test, giving every device of a claim the
first grant's CDI device passed every prepare test: none spanned two resources.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from tests.support.dra import dra_status, make_claim, running_devshim
from tests.support.dra_calls import GPU, HONEST, Devshim, pool_config, prepare, sim_driver, spec_of
from tests.support.unix import short_temp_dir

NODE = "node-across"
NIC = "example.com/nic"


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-across-") as path:
        yield path


def driver(folder: Path, who: str, resource: str, prefix: str) -> dict[str, Any]:
    sim = {
        "name": resource,
        "id_prefix": prefix,
        "count": 2,
        "grant": {"envs": {"SIM_DEVICES": f"{who}:{{ids}}"}},
    }
    return sim_driver(folder, who, sim)


async def test_each_device_of_a_claim_spanning_two_resources_gets_its_own_drivers_grant(
    plane: ControlPlane, folder: Path
) -> None:
    drivers = [driver(folder, "gpus", HONEST, "gpu-"), driver(folder, "nics", NIC, "nic-")]
    config = pool_config(folder, plane, NODE, drivers, [{"name": GPU, "resources": [HONEST, NIC]}])
    async with running_devshim(config) as (proc, port):
        shim = Devshim(folder, config, port, proc)
        await dra_status(port, lambda s: s[GPU]["devices"] == 4, "both resources are published")
        claim = make_claim(plane, "v1", "gpu-and-nic", [("gpu", "gpu-1"), ("nic", "nic-0")], node=NODE)
        uid = claim["metadata"]["uid"]
        answer = (await prepare(shim, [claim]))[uid]
        assert answer.error == ""
        named = {d.device_name: list(d.cdi_device_ids) for d in answer.devices}
        assert set(named) == {"gpu-1", "nic-0"}
        assert all(len(ids) == 1 for ids in named.values()), named
        assert named["gpu-1"] != named["nic-0"], "each resource's grant is a CDI device of its own"
        spec = json.loads(spec_of(shim, GPU, uid).read_text())
        edits = {f"{GPU}/claim={d['name']}": d["containerEdits"].get("env", []) for d in spec["devices"]}
        assert edits[named["gpu-1"][0]] == ["SIM_DEVICES=gpus:gpu-1"]
        assert edits[named["nic-0"][0]] == ["SIM_DEVICES=nics:nic-0"]
        calls = await shim.calls({"NodePrepareResources ok": 1})
        assert calls["gpus allocate"] == 1 and calls["nics allocate"] == 1, calls

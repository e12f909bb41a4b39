"""A legacy device plugin served through DRA, judged by the real kubelet's DRA manager (1.37): the
vendor-style Go plugin (tests/support/legacy_plugins/go, on the upstream API package) behind the
legacy adapter, its resource in a DRA driver's pool. Its devices are published (with their NUMA
node, the only fact a device plugin gives beyond an ID), a claim's preparation is the plugin's
Allocate, and its answer reaches the container through devshim's CDI spec, the plugin's own CDI
names passed through to the vendor's spec."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shim.compat.realnode import ControlPlane
from shim.compat.upstream.dra_manager import (
    Container,
    ContainerClaim,
    DraManager,
    Pod,
    PodClaim,
    running_dra_manager,
)
from tests.support import control_plane
from tests.support.dra import GPU_DRIVER, Published, config, make_claim, running_devshim
from tests.support.dra_judge import CLAIMS_VERSION, RELEASES, build
from tests.support.unix import short_temp_dir

NODE = "node-legacy"
RESOURCE = "example.com/goplug"
NEWEST = RELEASES[-1]


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    build(NEWEST)
    with control_plane.running(NEWEST, "ds-legacy-cp-") as plane:
        plane.ensure("/api/v1/nodes", {"metadata": {"name": NODE}})
        yield plane


@pytest.fixture
async def manager(
    plane: ControlPlane, goplug: Path, private_dir: Path
) -> AsyncIterator[tuple[DraManager, Path]]:
    """devshim with the legacy adapter fronting the Go plugin as the pool's driver, and the DRA
    manager registered with it; the node's folder."""
    with short_temp_dir("ds-legacy-") as folder:
        adapter = [sys.executable, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private_dir)]
        plugin = [str(goplug), "-dir", str(private_dir), "-prestart"]
        path = config(
            folder,
            plane,
            NODE,
            # What the Go plugin's Allocate grants: its env, /dev/null as each device, its CDI kind.
            driver={
                "name": "legacy",
                "user": "root",
                "command": [*adapter, "--", *plugin],
                "policy": {
                    "envs": ["GOPLUG_DEVICES"],
                    "device_nodes": ["/dev/null"],
                    "cdi_kinds": [RESOURCE],
                },
            },
            resources=[RESOURCE],
        )
        for sub in ("registry", "dra-state", "cdi"):
            (folder / sub).mkdir(exist_ok=True)
        # The vendor's own CDI spec, as its installer leaves it on the node: the plugin's Allocate
        # names its devices in it.
        vendor = {
            "cdiVersion": "0.5.0",
            "kind": RESOURCE,
            "devices": [{"name": f"g{i}", "containerEdits": {"env": [f"GOPLUG_CDI=g{i}"]}} for i in range(3)],
        }
        (folder / "cdi" / "goplug.json").write_text(json.dumps(vendor))
        async with (
            running_devshim(path),
            running_dra_manager(NEWEST, build(NEWEST), folder / "dramanager.log") as dra,
        ):
            await dra.start(
                plane.admin_kubeconfig, NODE, folder / "dra-state", folder / "registry", [folder / "cdi"]
            )
            await dra.registered(GPU_DRIVER)
            yield dra, folder


async def test_a_legacy_plugins_devices_are_published_and_prepared_through_dra(
    plane: ControlPlane, manager: tuple[DraManager, Path]
) -> None:
    dra, folder = manager
    published = Published(plane, control_plane.NEWEST_DRA[plane.minor], NODE)
    pool = await published.until(lambda pool: len(pool) == 3, "the plugin's three devices are published")
    # The Go plugin puts g1 on NUMA node 1, the others on 0: the one attribute it gives.
    assert {name: d.get("attributes") for name, d in pool.items()} == {
        f"g{i}": {"resource.kubernetes.io/numaNode": {"int": i % 2}} for i in range(3)
    }
    pod = Pod(
        uid=str(uuid.uuid4()),
        name="pod-legacy",
        resource_claims=[PodClaim("one", resource_claim_name="one")],
        containers=[Container("c0", [ContainerClaim("one")])],
    )
    claim = make_claim(
        plane, CLAIMS_VERSION[plane.minor], "one", [("gpu", "g1")], node=NODE, pods=[(pod.name, pod.uid)]
    )
    uid = claim["metadata"]["uid"]
    await dra.prepare(pod)
    got = await dra.resources(pod.uid, "c0")
    # devshim's device for the grant, and the plugin's own CDI device passed through.
    assert set(got.cdi_devices) == {f"{GPU_DRIVER}/claim={uid}-0", f"{RESOURCE}=g1"}
    assert got.cdi_error == ""
    assert got.env_map["GOPLUG_DEVICES"] == "g1" and got.env_map["GOPLUG_CDI"] == "g1"
    assert [(d.path, d.type, d.major, d.minor) for d in got.devices] == [("/dev/goplug/g1", "c", 1, 3)]
    assert (folder / "cdi" / f"devshim-{GPU_DRIVER}-{uid}.json").exists()
    await dra.unprepare(pod.uid)
    assert not (folder / "cdi" / f"devshim-{GPU_DRIVER}-{uid}.json").exists()

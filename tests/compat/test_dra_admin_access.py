"""Admin access (resource.k8s.io adminAccess, GA in 1.36): a claim with admin access is prepared
beside the exclusive claim holding its device, takes nothing from it, and gives nothing back.

`devshim run` with two sim drivers against a real kube-apiserver (the claims are read from it, in
a namespace labelled for admin access as the API server demands), its DRA socket called as the
kubelet calls it. One resource declares admin_access (driver protocol 1.3), the other does not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from tests.support import control_plane
from tests.support.dra import dra_status, make_claim, running_devshim
from tests.support.dra_calls import (
    GPU,
    Devshim,
    pool_config,
    prepare,
    sim_driver,
    spec_of,
    status_when,
    unprepare,
)
from tests.support.unix import short_temp_dir

NODE = "node-admin"
ADMIN_NS = "monitoring"
PLAIN = "plain.example.com"  # a pool whose driver does not declare admin_access
ADMIN_LABEL = "resource.kubernetes.io/admin-access"


def resource(name: str, admin_access: bool) -> dict[str, Any]:
    return {
        "name": name,
        "devices": [{"id": "gpu-0"}, {"id": "gpu-1"}],
        "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
        "prestart": True,
        "deallocate": True,
        "admin_access": admin_access,
    }


# DRAAdminAccess: beta and on by default from 1.34 (alpha and off in 1.33: its API server drops
# adminAccess from the claim). The newest by default; --full-matrix adds 1.34.
RELEASES = [control_plane.param(r) for r in control_plane.APISERVERS if r.minor >= 34]


@pytest.fixture(scope="module", params=RELEASES)
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    with control_plane.running(request.param) as running:
        running.request(
            "POST", "/api/v1/namespaces", {"metadata": {"name": ADMIN_NS, "labels": {ADMIN_LABEL: "true"}}}
        )
        yield running


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-admin-") as path:
        yield path


@asynccontextmanager
async def devshim(folder: Path, plane: ControlPlane) -> AsyncIterator[Devshim]:
    drivers = [
        sim_driver(folder, "gpus", resource("example.com/gpu", admin_access=True)),
        sim_driver(folder, "plain", resource("example.com/plain", admin_access=False)),
    ]
    pools = [
        {"name": GPU, "resources": ["example.com/gpu"]},
        {"name": PLAIN, "resources": ["example.com/plain"]},
    ]
    config = pool_config(folder, plane, NODE, drivers, pools)
    async with running_devshim(config) as (proc, port):
        await dra_status(port, lambda s: all(s[d]["devices"] == 2 for d in (GPU, PLAIN)), "both pools served")
        yield Devshim(folder, config, port, proc)


def held_by_dra(status: dict[str, Any], resource: str) -> list[str]:
    """The devices of ``resource`` a claim holds (Unhealthy to the device plugin meanwhile)."""
    held: list[str] = status["resources"][resource]["held"]["dra"]
    return held


async def test_an_admin_claim_prepares_beside_the_exclusive_one_and_takes_nothing(
    plane: ControlPlane, folder: Path
) -> None:
    exclusive = make_claim(plane, "v1", "owner", [("gpu", "gpu-0")], node=NODE)
    admin = make_claim(plane, "v1", "watcher", [("gpu", "gpu-0")], node=NODE, namespace=ADMIN_NS, admin=True)
    assert admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] is True
    uid, admin_uid = exclusive["metadata"]["uid"], admin["metadata"]["uid"]
    async with devshim(folder, plane) as shim:
        assert (await prepare(shim, [exclusive]))[uid].error == ""
        answer = (await prepare(shim, [admin]))[admin_uid]
        assert answer.error == ""
        assert [d.device_name for d in answer.devices] == ["gpu-0"]
        assert spec_of(shim, GPU, admin_uid).is_file()
        # The driver was asked once for each, and prestart only for the exclusive claim.
        calls = await shim.calls({"NodePrepareResources ok": 2})
        assert calls == {"gpus allocate": 2, "gpus prestart": 1}
        # The admin claim goes; the exclusive claim still holds gpu-0, and the driver was told nothing.
        assert await unprepare(shim, [admin]) == {admin_uid: ""}
        status = await status_when(shim.port, lambda s: s["dra"][GPU]["kubelet"]["prepared_claims"] == 1)
        assert held_by_dra(status, "example.com/gpu") == ["gpu-0"]
        assert (await shim.calls({"NodeUnprepareResources ok": 1})).get("gpus deallocate", 0) == 0
        # A non-admin claim still cannot have it; once the owner goes, gpu-0 is free.
        rival = make_claim(plane, "v1", "rival", [("gpu", "gpu-0")], node=NODE)
        refused = (await prepare(shim, [rival]))[rival["metadata"]["uid"]].error
        assert f"held by claim default/owner ({uid}) through DRA" in refused
        assert await unprepare(shim, [exclusive]) == {uid: ""}
        status = await status_when(shim.port, lambda s: s["dra"][GPU]["kubelet"]["prepared_claims"] == 0)
        assert held_by_dra(status, "example.com/gpu") == []
        assert (await shim.calls({"NodeUnprepareResources ok": 2}))["gpus deallocate"] == 1


async def test_an_admin_claim_on_a_driver_without_admin_access_fails_saying_so(
    plane: ControlPlane, folder: Path
) -> None:
    admin = make_claim(
        plane,
        "v1",
        "plain-watcher",
        [("gpu", "gpu-1")],
        node=NODE,
        namespace=ADMIN_NS,
        driver=PLAIN,
        admin=True,
    )
    async with devshim(folder, plane) as shim:
        error = (await prepare(shim, [admin], driver=PLAIN))[admin["metadata"]["uid"]].error
        assert "an admin-access claim needs the driver to declare admin_access" in error
        status = await status_when(shim.port, lambda s: s["dra"][PLAIN]["kubelet"]["prepared_claims"] == 0)
        assert held_by_dra(status, "example.com/plain") == []
        assert not spec_of(shim, PLAIN, admin["metadata"]["uid"]).exists()

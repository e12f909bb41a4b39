"""DRA, part 2: devshim as the kubelet's DRA plugin, called here as the kubelet calls it.

`devshim run` with real driver subprocesses and a real kube-apiserver (the claims are read
from it), its DRA socket dialled over the wire with each DRAPlugin and DRAResourceHealth
version: registration, prepare (the CDI spec, the answer, idempotence), unprepare, claims
that cannot be prepared, a grant outside the policy, a driver crashing mid-prepare, devshim
killed between prepare and unprepare, health through both versions, two drivers' resources of
one pool listing the same device IDs. The real kubelet's DRA manager judges the same socket in
tests/compat/test_dra_manager.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from shim.compat.realnode import ControlPlane
from shim.dra.kube import ApiError, ApiServer
from shim.generated.dra.v1beta1 import api_pb2 as dra_v1beta1
from shim.generated.drahealth.v1 import api_pb2 as health_v1
from shim.generated.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from shim.generated.pluginregistration.v1 import api_pb2 as registration
from shim.status import render_status
from tests.support import DRIVERS, control_plane
from tests.support.dra import SIM, Published, control, dra_status, make_claim, running_devshim
from tests.support.dra_calls import (
    GPU,
    HONEST,
    HOSTILE,
    Devshim,
    granted_env,
    models,
    pool_config,
    prepare,
    sim_driver,
    spec_of,
    status_when,
    unprepare,
)
from tests.support.unix import short_temp_dir
from tests.support.waiting import until

NODE = "node-prep"
PREPARED, FAILED = "NodePrepareResources ok", "NodePrepareResources failed"
UNPREPARED = "NodeUnprepareResources ok"
FLAKY, GRANTING = "flaky.example.com", "granting.example.com"
SIM_GPUS: dict[str, Any] = {
    "name": "example.com/gpu",
    "devices": [{"id": f"gpu-{i}"} for i in range(4)],
    "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
    "prestart": True,
    "deallocate": True,
}


def write_config(folder: Path, plane: ControlPlane, flaky_env: dict[str, str] | None = None) -> Path:
    (folder / "sim.ctl").write_text("")
    (folder / "sim.yaml").write_text(
        yaml.safe_dump({"resources": [SIM_GPUS], "control_file": str(folder / "sim.ctl")})
    )
    # Each driver declared with the resource it serves and what its good grants hold: granting's
    # ok-N devices get /dev/null and GRANTING; its writable /etc mount is declared by no one.
    drivers = [
        {
            "name": "sim",
            "user": "root",
            "command": [*SIM, "--config", str(folder / "sim.yaml")],
            "resources": ["example.com/gpu"],
            "policy": {"envs": ["SIM_DEVICES"]},
        },
        {
            "name": "flaky",
            "user": "root",
            "command": [sys.executable, str(DRIVERS / "flaky.py")],
            "env": {"RUN_FILE": str(folder / "flaky.runs"), **(flaky_env or {})},
            "restart": {"backoff_initial_s": 0.05, "backoff_max_s": 0.2},
            "resources": ["example.com/flaky"],
            "policy": {"envs": ["FLAKY"]},
        },
        {
            "name": "granting",
            "user": "root",
            "command": [sys.executable, str(DRIVERS / "granting.py")],
            "env": {"DEALLOCATED": str(folder / "deallocated")},
            "resources": ["example.com/granting"],
            "policy": {"envs": ["GRANTING"], "device_nodes": ["/dev/null"]},
        },
    ]
    pools = [
        {"name": GPU, "resources": ["example.com/gpu"]},
        {"name": FLAKY, "resources": ["example.com/flaky"]},
        {"name": GRANTING, "resources": ["example.com/granting"]},
    ]
    return pool_config(folder, plane, NODE, drivers, pools)


@asynccontextmanager
async def devshim_in(folder: Path, plane: ControlPlane, **kwargs: Any) -> AsyncIterator[Devshim]:
    config = folder / "devshim.yaml"
    if not config.exists():
        config = write_config(folder, plane, **kwargs)
    async with running_devshim(config) as (proc, port):
        shim = Devshim(folder, config, port, proc)
        await dra_status(
            port,
            lambda s: (
                all(s[d]["kubelet"]["registered"] is None and s[d]["devices"] for d in (GPU, GRANTING))
                and s[FLAKY]["devices"] == 2
            ),
            "every DRA driver serves its pool",
        )
        await until(
            lambda: shim.socket.exists() and shim.registration().exists(), "the DRA sockets are there"
        )
        yield shim


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-prep-") as path:
        yield path


def devices(answer: Any) -> list[tuple[list[str], str, str, list[str]]]:
    return [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in answer.devices
    ]


async def test_registration_offers_every_service_newest_first_and_the_dra_socket_by_path(
    plane: ControlPlane, folder: Path
) -> None:
    async with (
        devshim_in(folder, plane) as shim,
        grpc.aio.insecure_channel(f"unix:{shim.registration()}") as channel,
    ):
        raw = await channel.unary_unary("/pluginregistration.Registration/GetInfo", None, None)(
            registration.InfoRequest().SerializeToString(), timeout=10
        )
        info = registration.PluginInfo.FromString(raw)
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", GPU, str(shim.socket))
        assert list(info.supported_versions) == [
            "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"
        ]  # fmt: skip
        status = registration.RegistrationStatus(plugin_registered=True)
        await channel.unary_unary("/pluginregistration.Registration/NotifyRegistrationStatus", None, None)(
            status.SerializeToString(), timeout=10
        )
        report = await status_when(shim.port, lambda s: s["dra"][GPU]["kubelet"]["registered"] is True)
        text = render_status(report)  # what `devshim status` prints
        assert (
            "    kubelet: registered, calls nothing yet (health: none); 0 claims prepared; no calls" in text
        )


async def test_a_claim_is_prepared_once_as_a_cdi_spec_and_unprepared(
    plane: ControlPlane, folder: Path
) -> None:
    """Two GPUs of one claim: one driver call for both (SIM_DEVICES=gpu-0,gpu-1), one CDI device;
    the same answer again from the checkpoint, in either version; unprepare deallocates once."""
    claim = make_claim(plane, "v1", "two-gpus", [("gpus", "gpu-0"), ("gpus", "gpu-1")], node=NODE)
    uid = claim["metadata"]["uid"]
    async with devshim_in(folder, plane) as shim:
        answer = (await prepare(shim, [claim]))[uid]
        cdi_id = f"{GPU}/claim={uid}-0"
        assert answer.error == ""
        assert devices(answer) == [(["gpus"], NODE, "gpu-0", [cdi_id]), (["gpus"], NODE, "gpu-1", [cdi_id])]
        spec = json.loads(spec_of(shim, GPU, uid).read_text())
        assert spec == {
            "cdiVersion": "0.5.0" if uid[0].isdigit() else "0.3.0",  # a device name starting with a digit
            "kind": f"{GPU}/claim",
            "devices": [{"name": f"{uid}-0", "containerEdits": {"env": ["SIM_DEVICES=gpu-0,gpu-1"]}}],
        }
        assert await shim.calls({PREPARED: 1}) == {"sim allocate": 1, "sim prestart": 1}
        again = (await prepare(shim, [claim]))[uid]
        older = (await prepare(shim, [claim], dra_v1beta1))[uid]
        assert devices(again) == devices(older) == devices(answer)
        counts = await shim.calls({PREPARED: 3})
        assert counts == {"sim allocate": 1, "sim prestart": 1}, (
            "a prepared claim is answered from the checkpoint"
        )
        report = await status_when(
            shim.port, lambda s: s["dra"][GPU]["kubelet"]["service"] == "v1beta1.DRAPlugin"
        )
        assert "calls v1beta1.DRAPlugin (health: none); 1 claims prepared; 3 NodePrepareResources ok" in (
            render_status(report)
        )
        assert await unprepare(shim, [claim]) == {uid: ""}
        assert not spec_of(shim, GPU, uid).exists()
        assert await unprepare(shim, [claim], dra_v1beta1) == {uid: ""}, "unprepared already: no error"
        counts = await shim.calls({UNPREPARED: 2})
        assert counts == {"sim allocate": 1, "sim prestart": 1, "sim deallocate": 1}


async def test_claims_that_cannot_be_prepared_fail_alone(plane: ControlPlane, folder: Path) -> None:
    good = make_claim(plane, "v1", "good", [("gpu", "gpu-2")], node=NODE)
    gone = dict(
        good, metadata=dict(good["metadata"], name="never-made", uid="00000000-0000-0000-0000-00000000dead")
    )
    recreated = dict(good, metadata=dict(good["metadata"], uid="11111111-1111-1111-1111-111111111111"))
    elsewhere = make_claim(plane, "v1", "elsewhere", [("gpu", "gpu-3")], node="other-node")
    unknown = make_claim(plane, "v1", "unknown-device", [("gpu", "gpu-9")], node=NODE)
    unreserved = make_claim(plane, "v1", "unreserved", [("gpu", "gpu-3")], node=NODE, pods=[])
    # What the kubelet names a claim by becomes a file name and an API path: checked first.
    traversal = dict(good, metadata=dict(good["metadata"], uid="../../../etc/passwd"))
    async with devshim_in(folder, plane) as shim:
        answers = await prepare(shim, [good, gone, recreated, elsewhere, unknown, unreserved, traversal])
        named = {"never-made": gone, "recreated": recreated, "elsewhere": elsewhere, "unknown": unknown}
        errors = {
            name: answers[c["metadata"]["uid"]].error
            for name, c in (named | {"unreserved": unreserved, "traversal": traversal}).items()
        }
        assert errors["traversal"] == "'../../../etc/passwd' is not a uid"
        assert answers[good["metadata"]["uid"]].error == ""
        assert "404" in errors["never-made"]
        assert "deleted and created again" in errors["recreated"]
        assert "not this node's" in errors["elsewhere"]
        assert "'gpu-9' is not among the devices" in errors["unknown"]
        assert "reserved for no pod" in errors["unreserved"]
        assert all(not answers[c["metadata"]["uid"]].devices for c in (gone, elsewhere, unknown, unreserved))
        assert await shim.calls({PREPARED: 1, FAILED: 6}) == {"sim allocate": 1, "sim prestart": 1}
        assert sorted(p.name for p in (folder / "cdi").iterdir()) == [
            f"devshim-{GPU}-{good['metadata']['uid']}.json"
        ]


async def test_a_grant_outside_the_policy_fails_its_claim_and_is_deallocated(
    plane: ControlPlane, folder: Path
) -> None:
    ok = make_claim(plane, "v1", "null-node", [("dev", "ok-0")], node=NODE, driver=GRANTING)
    bad = make_claim(plane, "v1", "etc-mount", [("dev", "mount")], node=NODE, driver=GRANTING)
    async with devshim_in(folder, plane) as shim:
        answers = await prepare(shim, [ok, bad], driver=GRANTING)
        refused = answers[bad["metadata"]["uid"]]
        assert "outside" in refused.error or "policy" in refused.error, refused.error
        assert not refused.devices and not spec_of(shim, GRANTING, bad["metadata"]["uid"]).exists()
        record = folder / "deallocated"
        await until(
            lambda: record.exists() and "mount" in record.read_text(), "the refused grant is deallocated"
        )
        spec = json.loads(spec_of(shim, GRANTING, ok["metadata"]["uid"]).read_text())
        assert spec["cdiVersion"] == "0.5.0"  # a device node whose host path is not its path
        assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/ok-0", "hostPath": "/dev/null", "permissions": "rw"}
        ]


async def test_a_driver_crashing_during_prepare_fails_the_claim_until_it_is_back(
    plane: ControlPlane, folder: Path
) -> None:
    claim = make_claim(plane, "v1", "crashing", [("f", "f-0")], node=NODE, driver=FLAKY)
    uid = claim["metadata"]["uid"]
    async with devshim_in(folder, plane, flaky_env={"FLAKY_MISBEHAVE": "exit_on_allocate"}) as shim:
        first = (await prepare(shim, [claim], driver=FLAKY))[uid]
        assert first.error and not first.devices
        assert not spec_of(shim, FLAKY, uid).exists()
        await until(
            lambda: (folder / "flaky.runs").read_text().count("start") == 2, "the driver is restarted"
        )
        second = (await prepare(shim, [claim], driver=FLAKY))[uid]
        assert second.error == "" and [d[2] for d in devices(second)] == ["f-0"]


async def test_devshim_killed_between_prepare_and_unprepare_neither_loses_nor_repeats(
    plane: ControlPlane, folder: Path
) -> None:
    claim = make_claim(plane, "v1", "survivor", [("gpu", "gpu-1")], node=NODE)
    uid = claim["metadata"]["uid"]
    async with devshim_in(folder, plane) as shim:
        answer = devices((await prepare(shim, [claim]))[uid])
        os.kill(shim.proc.pid, signal.SIGKILL)
        await shim.proc.wait()
    async with devshim_in(folder, plane) as shim:
        # The claim holds its device from the checkpoint, before the device plugin serves it.
        report = await status_when(shim.port, lambda s: "example.com/gpu" in s["resources"])
        assert report["resources"]["example.com/gpu"]["held"] == {"dra": ["gpu-1"], "device_plugin": []}
        assert "    held through DRA: gpu-1; through the device plugin: none" in render_status(report)
        assert devices((await prepare(shim, [claim]))[uid]) == answer
        assert await shim.calls({PREPARED: 1}) == {}, "not prepared again"
        assert spec_of(shim, GPU, uid).exists()
        # The first unprepare succeeds: it waits for the restarted driver (restart.call_wait_s),
        # since done without the driver its deallocate would be lost (issue 42, item 7).
        assert await unprepare(shim, [claim]) == {uid: ""}
        status = await status_when(
            shim.port, lambda s: s["dra"][GPU]["kubelet"]["calls"].get(UNPREPARED) == 1
        )
        sim = status["drivers"]["sim"]["calls"]
        assert (sim["deallocate"]["ok"], "allocate" in sim) == (1, False)
        assert not spec_of(shim, GPU, uid).exists()
        assert status["resources"]["example.com/gpu"]["held"]["dra"] == []


async def test_a_spec_the_cdi_folder_lost_is_written_again_at_start_and_at_a_repeated_prepare(
    plane: ControlPlane, folder: Path
) -> None:
    """Invariant: a claim prepared in this boot has its CDI spec on the node, the one its answer
    names. /var/run/cdi is a tmpfs that anyone root may clear; a restarted devshim puts the spec
    back before serving (the running kubelet does not prepare the claim again, but a restarting
    container resolves it again), and a repeated prepare (the kubelet's, after its own restart)
    puts it back too, both without asking the driver."""
    claim = make_claim(plane, "v1", "kept-spec", [("gpu", "gpu-2")], node=NODE)
    uid = claim["metadata"]["uid"]
    async with devshim_in(folder, plane) as shim:
        answer = devices((await prepare(shim, [claim]))[uid])
        written = spec_of(shim, GPU, uid).read_bytes()
    spec_of(shim, GPU, uid).unlink()
    async with devshim_in(folder, plane) as shim:
        assert spec_of(shim, GPU, uid).read_bytes() == written, "put back before the socket served"
        spec_of(shim, GPU, uid).unlink()
        assert devices((await prepare(shim, [claim]))[uid]) == answer
        assert spec_of(shim, GPU, uid).read_bytes() == written
        assert await shim.calls({PREPARED: 1}) == {}, "the driver was not asked again"


async def test_a_spec_that_cannot_be_written_fails_its_claim_and_undoes_the_preparation(
    plane: ControlPlane, folder: Path
) -> None:
    """The spec and the prepared entry are written at once: when the spec fails, the driver's
    allocation is undone, the checkpoint forgets the claim, and the kubelet's retry prepares it."""
    claim = make_claim(plane, "v1", "no-spec", [("gpu", "gpu-1")], node=NODE)
    uid = claim["metadata"]["uid"]
    async with devshim_in(folder, plane) as shim:
        cdi = folder / "cdi"
        shutil.rmtree(cdi, ignore_errors=True)
        cdi.write_text("a file where the CDI folder was")
        failed = (await prepare(shim, [claim]))[uid]
        assert str(cdi) in failed.error
        counts = await shim.calls({FAILED: 1})
        assert counts == {"sim allocate": 1, "sim prestart": 1, "sim deallocate": 1}
        assert json.loads((folder / "state" / "dra" / f"{GPU}.json").read_text())["claims"] == {}
        cdi.unlink()
        assert (await prepare(shim, [claim]))[uid].error == ""
        assert spec_of(shim, GPU, uid).exists()


async def test_after_a_reboot_a_claim_is_prepared_afresh_and_nothing_is_undone(
    plane: ControlPlane, folder: Path
) -> None:
    """Invariant: a preparation holds on the node only in the boot it was made in. After a
    reboot (here: the checkpoint's boot IDs another kernel's, the CDI tmpfs empty) the kubelet
    prepares its pods' claims again: the driver is asked again (its devices were reset), never
    to deallocate what the reboot undid, the claim holds its device meanwhile, and its later
    unprepare deallocates what this boot allocated, once."""
    claim = make_claim(plane, "v1", "rebooted", [("gpu", "gpu-3")], node=NODE)
    gone = make_claim(plane, "v1", "deleted-meanwhile", [("gpu", "gpu-0")], node=NODE)
    uid = claim["metadata"]["uid"]
    async with devshim_in(folder, plane) as shim:
        answer = devices((await prepare(shim, [claim, gone]))[uid])
    checkpoint = folder / "state" / "dra" / f"{GPU}.json"
    body = json.loads(checkpoint.read_text())
    assert body["claims"][uid]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for entry in body["claims"].values():
        entry["boot_id"] = "00000000-0000-4000-8000-000000000000"  # a boot before this one
    checkpoint.write_text(json.dumps(body))
    for stale in (spec_of(shim, GPU, c["metadata"]["uid"]) for c in (claim, gone)):
        stale.unlink()
    async with devshim_in(folder, plane) as shim:
        report = await status_when(shim.port, lambda s: "example.com/gpu" in s["resources"])
        assert report["resources"]["example.com/gpu"]["held"]["dra"] == ["gpu-0", "gpu-3"]
        assert not spec_of(shim, GPU, uid).exists(), "an earlier boot's spec is not put back"
        assert devices((await prepare(shim, [claim]))[uid]) == answer
        assert await shim.calls({PREPARED: 1}) == {"sim allocate": 1, "sim prestart": 1}
        assert spec_of(shim, GPU, uid).exists()
        # The other claim's pod went during the reboot: unprepared, its device free, no deallocate.
        assert await unprepare(shim, [gone]) == {gone["metadata"]["uid"]: ""}
        report = await status_when(shim.port, lambda s: s["dra"][GPU]["kubelet"]["calls"].get(UNPREPARED))
        assert report["resources"]["example.com/gpu"]["held"]["dra"] == ["gpu-3"]
        assert await shim.calls({UNPREPARED: 1}) == {"sim allocate": 1, "sim prestart": 1}
        assert await unprepare(shim, [claim]) == {uid: ""}
        counts = await shim.calls({UNPREPARED: 2})
        assert counts == {"sim allocate": 1, "sim prestart": 1, "sim deallocate": 1}


@pytest.mark.parametrize("pb", [health_v1, health_v1alpha1], ids=["v1", "v1alpha1"])
async def test_health_reaches_the_kubelet_through_each_health_version(
    plane: ControlPlane, folder: Path, pb: Any
) -> None:
    async with devshim_in(folder, plane) as shim, shim.channel() as channel:
        service = pb.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name
        stream = channel.unary_stream(f"/{service}/NodeWatchResources", None, None)(
            pb.NodeWatchResourcesRequest().SerializeToString(), timeout=60
        )
        reports = aiter(stream)

        async def next_report() -> dict[str, int]:
            message = pb.NodeWatchResourcesResponse.FromString(await anext(reports))
            assert all(
                d.device.pool_name == NODE and d.health_check_timeout_seconds == 30 for d in message.devices
            )
            return {d.device.device_name: d.health for d in message.devices}

        assert await next_report() == {f"gpu-{i}": pb.HEALTHY for i in range(4)}
        await control(folder, "health example.com/gpu gpu-1 Unhealthy")
        while (report := await next_report())["gpu-1"] != pb.UNHEALTHY:
            pass
        assert report == {f"gpu-{i}": pb.UNHEALTHY if i == 1 else pb.HEALTHY for i in range(4)}
        stream.cancel()
        version = service.rsplit(".", 2)[-2]
        await dra_status(
            shim.port,
            lambda s: s[GPU]["kubelet"]["health_service"] == f"{version}.DRAResourceHealth",
            "the version",
        )


async def test_a_removed_socket_is_served_again(plane: ControlPlane, folder: Path) -> None:
    async with devshim_in(folder, plane) as shim:
        for path in (shim.registration(), shim.socket):
            # The inode and its change time: a new socket may reuse the old one's inode number.
            before = (path.stat().st_ino, path.stat().st_ctime_ns)

            def back(path: Path = path, before: tuple[int, int] = before) -> bool:
                try:
                    now = path.stat()
                except FileNotFoundError:
                    return False
                return (now.st_ino, now.st_ctime_ns) != before

            path.unlink()
            await until(back, f"{path.name} is back", timeout=30)
        claim = make_claim(plane, "v1", "after-removal", [("gpu", "gpu-0")], node=NODE)
        assert (await prepare(shim, [claim]))[claim["metadata"]["uid"]].error == ""


# --- two resources of one pool, one hostile -----------------------------------

OWNERS_NODE = "node-owners"


def write_two_driver_config(folder: Path, plane: ControlPlane) -> Path:
    """One pool of two resources, the honest sim's listed first: it lists gpu-0 and gpu-1; the
    hostile sim lists nothing yet, and names its devices as the honest ones are named."""
    resources = [
        (HONEST, "honest", {"id_prefix": "gpu-", "count": 2, "attributes": {"model": {"string": "Honest"}}}),
        (
            HOSTILE,
            "hostile",
            {"id_prefix": "gpu-", "count": 0, "attributes": {"model": {"string": "Forged"}}},
        ),
    ]
    drivers = [
        sim_driver(folder, who, {"name": name, **rest, "grant": {"envs": {"SIM_DEVICES": f"{who}:{{ids}}"}}})
        for name, who, rest in resources
    ]
    return pool_config(folder, plane, OWNERS_NODE, drivers)


async def test_a_resource_listing_another_resources_device_ids_neither_takes_them_nor_stops_the_pool(
    plane: ControlPlane, folder: Path
) -> None:
    """The hostile driver's resource, listed second in the pool, takes up gpu-0 and gpu-1 after
    the honest one published them: the honest devices stay published with their attributes and
    are prepared by the honest driver, the hostile driver's own gpu-2 is published and prepared by
    it, /status keeps the clash as last_error until it ends, and the pool keeps taking changes
    (the honest driver's gpu-2 then takes that name: the configured order decides, not who
    listed an ID first)."""
    version = control_plane.NEWEST_DRA[plane.minor]
    published = Published(plane, version, OWNERS_NODE)
    async with running_devshim(write_two_driver_config(folder, plane)) as (proc, port):
        shim = Devshim(folder, folder / "devshim.yaml", port, proc)
        await published.until(
            lambda p: models(p) == {"gpu-0": "Honest", "gpu-1": "Honest"}, "the honest pool"
        )
        await control(folder / "hostile", f"count {HOSTILE} 3")  # gpu-0 and gpu-1 (the honest IDs), gpu-2

        pool = await published.until(lambda p: "gpu-2" in p, "the hostile driver's own device is published")
        assert models(pool) == {"gpu-0": "Honest", "gpu-1": "Honest", "gpu-2": "Forged"}
        status = await dra_status(port, lambda s: s[GPU]["devices"] == 3, "three devices are published")
        error = status[GPU]["last_error"]
        assert error is not None, "the clash shows in /status"
        assert f"device 'gpu-0' of {HOSTILE} is refused" in error and f"{HONEST}'s device 'gpu-0'" in error

        honest = make_claim(plane, version, "honest-gpu", [("gpu", "gpu-0")], node=OWNERS_NODE)
        hostile = make_claim(plane, version, "hostile-gpu", [("gpu", "gpu-2")], node=OWNERS_NODE)
        await until(shim.socket.exists, "the DRA socket is there")
        answers = await prepare(shim, [honest, hostile])
        honest_uid, hostile_uid = honest["metadata"]["uid"], hostile["metadata"]["uid"]
        assert answers[honest_uid].error == "" and answers[hostile_uid].error == ""
        assert granted_env(shim, honest_uid) == ["SIM_DEVICES=honest:gpu-0"], "prepared by the honest driver"
        assert granted_env(shim, hostile_uid) == ["SIM_DEVICES=hostile:gpu-2"]
        status = await dra_status(port, lambda s: True, "devshim answers")
        assert status[GPU]["last_error"] == error, "the clash stays in /status while it lasts"

        await control(folder / "honest", f"count {HONEST} 3")  # the honest gpu-2, listed first, wins
        await published.until(
            lambda p: models(p) == {"gpu-0": "Honest", "gpu-1": "Honest", "gpu-2": "Honest"},
            "the honest gpu-2 takes its name",
        )
        await control(folder / "hostile", f"count {HOSTILE} 0")
        status = await dra_status(port, lambda s: s[GPU]["last_error"] is None, "the clash is over")
        assert status[GPU]["devices"] == 3


async def test_a_claim_is_read_on_the_lean_path_as_the_api_server_holds_it(plane: ControlPlane) -> None:
    """Claim reads go over devshim's own kept-alive HTTP/1.1 (shim/dra/http.py), not kr8s: the same
    object the API server holds; a claim that is not there is ApiError 404, as through kr8s."""
    claim = make_claim(plane, "v1", "lean-read", [("gpus", "gpu-0")], node=NODE)
    api = await ApiServer.connect(plane.admin_kubeconfig)
    read = await api.get_claim("v1", "default", "lean-read")
    assert api.lean and read == plane.request(
        "GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/lean-read"
    )
    assert read["metadata"]["uid"] == claim["metadata"]["uid"]
    with pytest.raises(ApiError) as missing:
        await api.get_claim("v1", "default", "no-such-claim")
    assert missing.value.http_status == 404 and "not found" in str(missing.value)

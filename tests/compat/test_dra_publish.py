"""DRA, part 1: a devshim driver's devices published as ResourceSlices on a real API server.

Each test runs `devshim run` with the sim as its driver against a real kube-apiserver and etcd
(tests/support/control_plane.py), and reads what it published as a scheduler would: the pool's
newest generation, complete. Every release reads the slices in its own newest resource.k8s.io
version; the upgrade test moves one API server across the version change with devshim running.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases as upstream
from shim.dra.names import device_name
from shim.dra.node import FIRST_POOL_WAIT_S
from tests.support import control_plane
from tests.support.dra import SIM_GPUS, Published, config, control, dra_status, running, running_devshim
from tests.support.unix import short_temp_dir

RELEASES = [control_plane.param(r) for r in control_plane.APISERVERS]
# Slices deleted by someone else are back within this: the watch's event and one write take well
# under a second (publisher.py).
REPUBLISH_S = 5.0


@pytest.fixture(scope="module", params=RELEASES)
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """One control plane per release for the module; each test publishes as a node of its own."""
    release: upstream.Release = request.param
    with control_plane.running(release) as running:
        yield running


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-dra-") as path:
        yield path


def version_of(plane: ControlPlane) -> str:
    return control_plane.NEWEST_DRA[plane.minor]


def shown(device: dict[str, Any], version: str) -> dict[str, Any]:
    """A published device's attributes and capacity, whatever the version's shape."""
    described = device.get("basic", {}) if version in ("v1beta1", "v1alpha3") else device
    return {"attributes": described.get("attributes", {}), "capacity": described.get("capacity", {})}


async def test_the_sims_devices_are_published_with_attributes_and_capacity_in_the_servers_version(
    plane: ControlPlane, folder: Path
) -> None:
    """Every device, its attributes typed and its capacities as quantities, device-level values
    over the resource's, in the newest version the server serves; names are DNS labels."""
    version = version_of(plane)
    published = Published(plane, version, "node-attrs")
    async with running_devshim(config(folder, plane, "node-attrs", SIM_GPUS)) as (_, port):
        pool = await published.until(lambda p: len(p) == 4, "the four GPUs are published")
        status = await dra_status(port, lambda s: s["gpu.example.com"]["version"] == version, "the version")
        # Read while devshim serves: what its stop writes is not this test's question.
        [item] = published.slices()
    assert sorted(pool) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3-" + pool_suffix(pool)]
    common = {"model": {"string": "SimGPU"}, "gpu.example.com/ecc": {"bool": True}}
    assert shown(pool["gpu-0"], version) == {
        # Its one NUMA node as the standard attribute (docs/dra.md).
        "attributes": {**common, "cores": {"int": 108}, "resource.kubernetes.io/numaNode": {"int": 0}},
        "capacity": {"memory": {"value": "16Gi"}},
    }
    assert shown(pool["gpu-1"], version)["attributes"]["driverVersion"] == {"version": "550.54.15"}
    assert shown(pool["gpu-2"], version)["capacity"] == {"memory": {"value": "80Gi"}}
    assert item["spec"]["nodeName"] == "node-attrs"
    assert item["spec"]["pool"] == {"name": "node-attrs", "generation": 1, "resourceSliceCount": 1}
    assert status["gpu.example.com"] | {"published_at": None} == status["gpu.example.com"] | {
        "published_at": None,
        "generation": 1,
        "slices": 1,
        "devices": 4,
        "last_error": None,
    }


def pool_suffix(pool: dict[str, Any]) -> str:
    """The hash suffix of GPU_3's name (docs/dra.md, "Device names")."""
    [name] = [n for n in pool if n.startswith("gpu-3-")]
    return name.removeprefix("gpu-3-")


async def test_hot_plug_bumps_the_generation_and_health_changes_nothing_published(
    plane: ControlPlane, folder: Path
) -> None:
    """A device added is published under the next generation; one going Unhealthy stays
    published as it was (health reaches the kubelet through DRA's health service, not slices)."""
    version = version_of(plane)
    published = Published(plane, version, "node-plug")
    sim = {"name": "example.com/gpu", "count": 2, "attributes": {"model": {"string": "SimGPU"}}}
    async with running_devshim(config(folder, plane, "node-plug", sim)) as (_, port):
        await published.until(lambda p: sorted(p) == ["gpu-0", "gpu-1"], "two GPUs")
        await control(folder, "count example.com/gpu 3")
        pool = await published.until(lambda p: len(p) == 3, "the third GPU is published")
        assert shown(pool["gpu-2"], version)["attributes"] == {"model": {"string": "SimGPU"}}
        [before] = published.slices()
        assert before["spec"]["pool"]["generation"] == 2
        await control(folder, "health example.com/gpu gpu-1 Unhealthy")
        await dra_status(port, lambda s: True, "devshim answers")
        await control(folder, "count example.com/gpu 4")  # a later change shows the health one was seen
        await published.until(lambda p: len(p) == 4, "the fourth GPU is published")
        [after] = published.slices()
    assert "gpu-1" in {d["name"] for d in after["spec"]["devices"]}
    assert after["spec"]["pool"]["generation"] == 3  # one bump for the hot-plug, none for health
    assert after["metadata"]["uid"] == before["metadata"]["uid"]  # updated in place


async def test_slices_deleted_by_someone_else_are_published_again(plane: ControlPlane, folder: Path) -> None:
    """The kubelet deletes a node's slices when it starts: devshim watches its own and puts the
    pool back, under a newer generation, at once: within REPUBLISH_S, and before the one-shot
    timer of the first publish (FIRST_POOL_WAIT_S) could wake the publisher in its stead."""
    published = Published(plane, version_of(plane), "node-wiped")
    started = time.monotonic()  # before devshim's start, so before its timer was set
    async with running_devshim(config(folder, plane, "node-wiped", SIM_GPUS)):
        await published.until(lambda p: len(p) == 4, "the pool is published")
        [first] = published.slices()
        assert time.monotonic() - started + REPUBLISH_S < FIRST_POOL_WAIT_S, "too slow a start to tell"
        plane.request(
            "DELETE",
            f"/apis/resource.k8s.io/{published.version}/resourceslices?fieldSelector=spec.nodeName=node-wiped",
        )
        await published.until(
            lambda p: len(p) == 4 and _uid(published) != first["metadata"]["uid"],
            "published again",
            timeout=REPUBLISH_S,
        )
    [again] = published.slices()
    assert again["spec"]["pool"]["generation"] > first["spec"]["pool"]["generation"]


def _uid(published: Published) -> str | None:
    items = published.slices()
    return items[0]["metadata"]["uid"] if items else None


async def test_a_stopped_restarted_or_killed_devshim_leaves_its_pool_as_it_was(
    plane: ControlPlane, folder: Path
) -> None:
    """Invariant: the published pool is the node's devices, whether devshim runs or not. A
    graceful stop (a rolling update's SIGTERM) writes nothing: its drivers stop after the
    publisher, so their devices never leave the pool; a devshim started again takes the pool up
    without a write; SIGKILL leaves it as it was too."""
    published = Published(plane, version_of(plane), "node-stops")
    config_file = config(folder, plane, "node-stops", SIM_GPUS)
    async with running_devshim(config_file) as (_, port):
        await published.until(lambda p: len(p) == 4, "the four GPUs are published")
        await dra_status(port, lambda s: s["gpu.example.com"]["devices"] == 4, "published")
        [before] = published.slices()
    assert published.slices() == [before], "the graceful stop rewrote the pool"
    # No resource left the pool while devshim stopped (a write it could still have made, given
    # time: the publisher stops first, so none is due).
    assert "its devices leave the pool" not in (folder / "devshim.log").read_text()
    async with running(config_file) as devshim:
        status = await dra_status(devshim.port, lambda s: s["gpu.example.com"]["rounds"] >= 1, "a look")
        assert status["gpu.example.com"]["writes"] == 0
        assert published.slices() == [before]
        await devshim.kill()
    assert published.slices() == [before]


async def test_a_restarted_api_server_is_published_to_again(plane: ControlPlane, folder: Path) -> None:
    """devshim outlives an API server restart: its watch ends, it lists again, and a change made
    after the restart is published."""
    published = Published(plane, version_of(plane), "node-restart")
    sim = {"name": "example.com/gpu", "count": 1}
    async with running_devshim(config(folder, plane, "node-restart", sim)):
        await published.until(lambda p: len(p) == 1, "one GPU")
        plane.restart()
        await control(folder, "count example.com/gpu 2")
        await published.until(lambda p: len(p) == 2, "the second GPU, after the restart", timeout=90)


async def test_many_devices_split_across_slices_at_the_per_slice_limit(
    plane: ControlPlane, folder: Path
) -> None:
    """300 devices: three slices of at most 128, one generation, resourceSliceCount 3."""
    published = Published(plane, version_of(plane), "node-many")
    sim = {"name": "example.com/gpu", "count": 300}
    async with running_devshim(config(folder, plane, "node-many", sim)):
        pool = await published.until(lambda p: len(p) == 300, "300 devices")
    items = published.slices()
    assert sorted(len(s["spec"]["devices"]) for s in items) == [44, 128, 128]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in items} == {3}
    assert len(pool) == 300


UPGRADE = (33, 34)  # adjacent releases across the change of version: v1beta2, then v1


@pytest.mark.full_matrix  # two real API servers built and run in turn: 14 s of the default suite
async def test_an_api_server_upgraded_across_the_version_change_loses_no_device(folder: Path) -> None:
    """1.33 (newest v1beta2) upgraded to 1.34 (v1) on the same etcd data, devshim running: every
    read of the pool during the switch finds it whole; devshim finds v1 and, the slices being
    already right, writes nothing; a later change is published in v1."""
    old, new = (upstream.choose([f"upstream-1.{m}"])[0] for m in UPGRADE)
    control_plane.build(new)
    with control_plane.running(old) as plane:
        before = Published(plane, "v1beta2", "node-upgrade")
        async with running_devshim(config(folder, plane, "node-upgrade", SIM_GPUS)) as (_, port):
            pool = await before.until(lambda p: len(p) == 4, "the pool is published in v1beta2")
            assert shown(pool["gpu-0"], "v1beta2")["attributes"]["cores"] == {"int": 108}
            await dra_status(port, lambda s: s["gpu.example.com"]["version"] == "v1beta2", "v1beta2")
            [first] = before.slices()
            reads: list[int] = []
            watching = asyncio.create_task(_read_all_along(plane, "node-upgrade", reads))
            await asyncio.to_thread(plane.upgrade, new.minor)
            status = await dra_status(
                port, lambda s: s["gpu.example.com"]["version"] == "v1", "v1", timeout=90
            )
            after = Published(plane, "v1", "node-upgrade")
            await after.until(lambda p: len(p) == 4, "the pool read in v1")
            watching.cancel()
            [same] = after.slices()
            assert same["metadata"]["uid"] == first["metadata"]["uid"]
            assert same["spec"]["pool"]["generation"] == first["spec"]["pool"]["generation"]
            assert status["gpu.example.com"]["writes"] == 1  # the first publish, nothing since
            await control(folder, "count example.com/gpu 5")
            await after.until(lambda p: len(p) == 5, "a hot-plug after the upgrade is published in v1")
    assert reads and set(reads) == {4}, f"pool sizes read during the upgrade: {sorted(set(reads))}"


async def _read_all_along(plane: ControlPlane, node: str, sizes: list[int]) -> None:
    """The pool's size at every read that succeeds, in whichever version answers."""
    while True:
        for version in ("v1", "v1beta2"):
            try:
                pool = await asyncio.to_thread(Published(plane, version, node).pool)
            except Exception:  # the server restarting, or not serving this version
                continue
            if pool is not None:
                sizes.append(len(pool))
                break
        await asyncio.sleep(0.05)


async def test_devfs_publishes_each_nodes_name(plane: ControlPlane, folder: Path) -> None:
    """The devfs driver (adapters/devfs), unchanged but for protocol 1.1: each matched node is a
    device whose `node` attribute is its file name (and `numaNode` where sysfs has one)."""
    dev = folder / "dev"
    dev.mkdir()
    for name in ("ttyUSB0", "ttyUSB1"):
        (dev / name).touch()
    devfs = folder / "devfs.json"
    group = {
        "resource": "example.com/serial",
        "paths": [str(dev / "ttyUSB*")],
        "container_path": "/dev/{name}",
    }
    devfs.write_text(json.dumps({"groups": [group], "poll_interval_s": 0.2}))
    driver = {
        "name": "devfs",
        "user": "root",
        "command": [sys.executable, "-m", "devshim_adapters.devfs", "--config", str(devfs)],
        "policy": {
            "device_nodes": [str(dev / "ttyUSB*")],
            "device_node_types": None,
            "allow_world_writable_dirs": True,
        },
    }
    version = version_of(plane)
    published = Published(plane, version, "node-devfs")
    settings = config(folder, plane, "node-devfs", driver=driver, resources=["example.com/serial"])
    async with running_devshim(settings):
        pool = await published.until(lambda p: len(p) == 2, "both serial adapters")
        (dev / "ttyUSB2").touch()
        pool = await published.until(lambda p: len(p) == 3, "the hot-plugged adapter")
    attributes = sorted(shown(d, version)["attributes"]["node"]["string"] for d in pool.values())
    assert attributes == ["ttyUSB0", "ttyUSB1", "ttyUSB2"]
    # Not DNS labels (upper case): each ID is lowercased and given its hash (docs/dra.md).
    assert sorted(pool) == sorted(device_name(f"ttyUSB{i}") for i in range(3))
    assert all(n.startswith("ttyusb") for n in pool)


async def test_ten_thousand_devices_are_79_slices_written_once_each(
    plane: ControlPlane, folder: Path
) -> None:
    """10,000 devices: 78 slices of 128 and one of 16, one write each (devshim's status counts
    the API calls that write); the time to publish is in docs/benchmarks.md (row dra)."""
    published = Published(plane, version_of(plane), "node-10k")
    sim = {"name": "example.com/gpu", "count": 10_000, "attributes": {"model": {"string": "SimGPU"}}}
    async with running_devshim(config(folder, plane, "node-10k", sim)) as (_, port):
        await published.until(lambda p: len(p) == 10_000, "10,000 devices", timeout=120)
        status = await dra_status(port, lambda s: s["gpu.example.com"]["devices"] == 10_000, "status")
    sizes = sorted(len(s["spec"]["devices"]) for s in published.slices())
    assert sizes == [16] + [128] * 78
    assert status["gpu.example.com"]["writes"] == 79
    assert status["gpu.example.com"]["slices"] == 79

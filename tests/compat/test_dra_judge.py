"""devshim judged by the real kubelet DRA manager: an unchanged devshim driver (the sim) serves a
pod's claim end to end, slice → allocation → prepare → OCI spec → unprepare, under the DRA
manager and plugin manager of 1.33 (v1beta1 only), 1.34 (v1beta1 and v1) and 1.37 (the newest),
each with the API server of its release.

`devshim run` publishes the pool to the real API server; the test writes the claim's allocation
and reservation as the scheduler would, from the published slice; the manager (the harness of
shim.compat.upstream.dra_manager) registers devshim through the real plugin watcher, prepares
the pod's claims through devshim's DRA socket, and resolves the CDI IDs it gets back with the
CDI library into an OCI spec: what a container would really get. What every driver must show
(a shared claim, a device's health, restarts, an API server upgrade) is judged by `devshim
compat --dra`'s rows, run on the sim by tests/compat/test_compat_dra.py; here, what the sim's
grant makes of a claim, and the driver's own calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from shim.compat.dra_world import DraNode, dra_node, running_devshim
from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases as upstream
from shim.compat.upstream.dra_manager import (
    Container,
    ContainerClaim,
    DraManagerError,
    Pod,
    PodClaim,
)
from tests.support import control_plane
from tests.support.dra import GPU_DRIVER, Published, config, make_claim
from tests.support.dra_judge import CLAIMS_VERSION, RELEASES, build, param
from tests.support.unix import short_temp_dir

NODE = "node-j"
# The newest release in the default run (`devshim compat --dra`'s rows judge 1.33 by default, in
# tests/compat/test_compat_dra.py); every release with --full-matrix (the default suite's budget).
NEWEST = (RELEASES[-1],)


SIM_GPUS: dict[str, Any] = {
    "name": "example.com/gpu",
    "devices": [{"id": f"gpu-{i}", "numa_nodes": [0]} for i in range(3)],
    "grant": {
        "envs": {"SIM_DEVICES": "{ids}"},
        "device_nodes": [{"container_path": "/dev/sim-{id}", "host_path": "/dev/null"}],
    },
    "prestart": True,
    "deallocate": True,
}
PREPARED, UNPREPARED = "NodePrepareResources ok", "NodeUnprepareResources ok"


@pytest.fixture(scope="module", params=[param(r, NEWEST) for r in RELEASES])
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    release: upstream.Release = request.param
    build(release)
    with control_plane.running(release, "ds-judge-cp-") as plane:
        plane.ensure("/api/v1/nodes", {"metadata": {"name": NODE}})
        yield plane


async def kubelet_calls(node: DraNode, **counts: int) -> dict[str, Any]:
    """devshim's status once its DRA driver answered the kubelet as ``counts`` say (prepared=1
    and so on); the sim's tallies in the same snapshot."""
    wanted = {{"prepared": PREPARED, "unprepared": UNPREPARED}[k]: n for k, n in counts.items()}
    return await node.devshim.status(
        lambda s: all(s["dra"][GPU_DRIVER]["kubelet"]["calls"].get(k, 0) == n for k, n in wanted.items()),
        f"the kubelet's calls are {wanted}",
    )


def sim_calls(status: dict[str, Any]) -> dict[str, int]:
    calls = status["drivers"]["sim"]["calls"]
    return {m: t["ok"] for m, t in calls.items() if m != "list_devices"}


def kubelet(plane: ControlPlane, folder: Path) -> AbstractAsyncContextManager[DraNode]:
    """devshim serving the sim's GPUs as DRA driver gpu.example.com, and the release's DRA manager
    started for NODE on devshim's plugins_registry and CDI dir, with devshim registered (the
    world of `devshim compat --dra`, shim.compat.dra_world)."""
    path = folder / "devshim.yaml"
    if not path.exists():
        config(folder, plane, NODE, SIM_GPUS)
    return dra_node(plane, plane.release, build(plane.release), folder, path, node=NODE, driver=GPU_DRIVER)


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-judge-") as path:
        yield path


def pod_using(claim: str, *, containers: int = 1) -> Pod:
    return Pod(
        uid=str(uuid.uuid4()),
        name=f"pod-{uuid.uuid4().hex[:6]}",
        resource_claims=[PodClaim(claim, resource_claim_name=claim)],
        containers=[Container(f"c{i}", [ContainerClaim(claim)]) for i in range(containers)],
    )


async def allocate(node: DraNode, name: str, devices: list[str], pods: list[Pod]) -> dict[str, Any]:
    """The scheduler's part: ``devices`` picked from the published pool, written into a new claim
    with its reservation for ``pods``."""
    version = CLAIMS_VERSION[node.plane.minor]
    published = Published(node.plane, control_plane.NEWEST_DRA[node.plane.minor], NODE)
    await published.until(lambda pool: set(devices) <= set(pool), f"{devices} are published")
    results = [(f"r{i}", d) for i, d in enumerate(devices)]
    return make_claim(node.plane, version, name, results, node=NODE, pods=[(p.name, p.uid) for p in pods])


def expected_service(minor: int) -> str:
    # 1.33 knows only v1beta1 of devshim's list; later kubelets take the first they know.
    return "v1beta1.DRAPlugin" if minor == 33 else "v1.DRAPlugin"


async def test_a_claim_is_served_end_to_end_in_the_version_the_kubelet_chose(
    plane: ControlPlane, folder: Path
) -> None:
    """Registered through the real plugin watcher with every service devshim offers; a claim of
    two GPUs prepared through the release's chosen version; the container gets the grant as the
    CDI library resolves it (env, device nodes), the other container nothing; unprepared: the
    driver's deallocate, the spec gone."""
    async with kubelet(plane, folder) as node:
        [registration] = [r for r in await node.manager.registrations() if r.op == "register"]
        assert registration.versions == (
            "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"
        )  # fmt: skip
        assert registration.endpoint == str(folder / "plugins" / GPU_DRIVER / "dra.sock")
        pod = pod_using("two-gpus", containers=2)
        pod = Pod(pod.uid, pod.name, pod.resource_claims, [pod.containers[0], Container("plain")])
        claim = await allocate(node, "two-gpus", ["gpu-0", "gpu-2"], [pod])
        uid = claim["metadata"]["uid"]
        await node.manager.prepare(pod)
        got = await node.manager.resources(pod.uid, "c0")
        assert got.cdi_error == ""
        assert set(got.cdi_devices) == {f"{GPU_DRIVER}/claim={uid}-0"}
        assert got.env_map["SIM_DEVICES"] == "gpu-0,gpu-2"
        assert sorted((d.path, d.type, d.major, d.minor) for d in got.devices) == [
            ("/dev/sim-gpu-0", "c", 1, 3), ("/dev/sim-gpu-2", "c", 1, 3)
        ]  # fmt: skip
        assert (await node.manager.resources(pod.uid, "plain")).cdi_devices == ()
        status = await kubelet_calls(node, prepared=1)
        assert status["dra"][GPU_DRIVER]["kubelet"]["service"] == expected_service(plane.minor)
        assert sim_calls(status) == {"allocate": 1, "prestart": 1}
        await node.manager.unprepare(pod.uid)
        status = await kubelet_calls(node, prepared=1, unprepared=1)
        assert sim_calls(status) == {"allocate": 1, "prestart": 1, "deallocate": 1}
        assert not list((folder / "cdi").glob("*.json"))


async def test_kubelet_and_devshim_restarts_between_prepare_and_unprepare(
    plane: ControlPlane, folder: Path
) -> None:
    """A kubelet restart prepares the claim again: devshim answers from its checkpoint, the driver
    not asked again. devshim killed and started again: the plugin watcher registers it anew, the
    container still resolves, and unprepare reaches the driver's deallocate."""
    async with kubelet(plane, folder) as node:
        pod = pod_using("survivor")
        claim = await allocate(node, "survivor", ["gpu-1"], [pod])
        cdi_id = f"{GPU_DRIVER}/claim={claim['metadata']['uid']}-0"
        await node.manager.prepare(pod)
        await node.manager.restart()
        await node.manager.registered(GPU_DRIVER)
        await node.manager.prepare(pod)  # the pod's next sync, as after a kubelet restart
        status = await kubelet_calls(node, prepared=2)
        assert sim_calls(status) == {"allocate": 1, "prestart": 1}, "answered from the checkpoint"
        await node.devshim.kill()
        # devshim's restart: a new process (fresh tallies), the same folders and manager.
        async with running_devshim(folder / "devshim.yaml") as devshim:
            again = dataclasses.replace(node, devshim=devshim)
            await again.registered()
            # 1.33's manager lists a device again for each time it was prepared: the same ID.
            assert set((await node.manager.resources(pod.uid, "c0")).cdi_devices) == {cdi_id}
            # The kubelet retries an unprepare that fails while the driver is starting again.
            while True:
                try:
                    await node.manager.unprepare(pod.uid)
                    break
                except DraManagerError as refused:
                    assert "the driver is not running" in str(refused), refused
                    await asyncio.sleep(0.1)
            status = await kubelet_calls(again, unprepared=1)
            assert sim_calls(status) == {"deallocate": 1}
            assert not list((folder / "cdi").glob("*.json"))

"""devshim judged by the real kubelet DRA manager: an unchanged devshim driver (the sim) serves a
pod's claim end to end, slice → allocation → prepare → OCI spec → unprepare, under the DRA
manager and plugin manager of 1.33 (v1beta1 only), 1.34 (v1beta1 and v1) and 1.37 (the newest),
each with the API server of its release.

`devshim run` publishes the pool to the real API server; the test writes the claim's allocation
and reservation as the scheduler would, from the published slice; the manager (the harness of
shim.compat.upstream.dra_manager) registers devshim through the real plugin watcher, prepares
the pod's claims through devshim's DRA socket, and resolves the CDI IDs it gets back with the
CDI library into an OCI spec: what a container would really get.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shim.compat.node import ControlPlane
from shim.compat.upstream import releases as upstream
from shim.compat.upstream.dra_manager import (
    Container,
    ContainerClaim,
    DraManager,
    DraManagerError,
    Pod,
    PodClaim,
    running_dra_manager,
)
from tests.support import control_plane
from tests.support.devshim_process import http_get
from tests.support.dra import GPU_DRIVER, Published, config, control, make_claim, running_devshim
from tests.support.dra_judge import CLAIMS_VERSION, RELEASES, build, param
from tests.support.unix import short_temp_dir

NODE = "node-j"
# The oldest and newest release in the default run for the end-to-end claim and the restarts
# (1.33: v1beta1 only; 1.37: v1 and v1 health); the rest at the newest, and every release with
# --full-matrix (the default suite's budget: 1.34 adds v1alpha1 health and 18 s).
DEFAULT = (RELEASES[0], RELEASES[-1])
NEWEST = (RELEASES[-1],)


def newest_only(request: pytest.FixtureRequest, plane: ControlPlane) -> None:
    """Skip this test's cells other than the newest release's unless --full-matrix."""
    if plane.release not in NEWEST and not request.config.getoption("--full-matrix"):
        pytest.skip("outside the default matrix subset; run with --full-matrix")


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


@pytest.fixture(scope="module", params=[param(r, DEFAULT) for r in RELEASES])
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    release: upstream.Release = request.param
    build(release)
    with control_plane.running(release, "ds-judge-cp-") as plane:
        plane.ensure("/api/v1/nodes", {"metadata": {"name": NODE}})
        yield plane


@dataclass
class Kubelet:
    """devshim and the release's DRA manager on one node, sharing its folders."""

    plane: ControlPlane
    folder: Path
    manager: DraManager
    port: int
    proc: Any

    async def status(self, holds: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """devshim's /status once ``holds`` it (a condition: /status is a snapshot up to 0.2 s old)."""
        last: Any = None
        try:
            async with asyncio.timeout(60):
                while True:
                    try:
                        code, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{self.port}/status")
                    except OSError:  # not serving yet
                        code, body = 0, ""
                    if code == 200 and holds(last := json.loads(body)):
                        return dict(last)
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"timed out waiting until {what}; /status was {last}") from None

    async def kubelet_calls(self, **counts: int) -> dict[str, Any]:
        """devshim's status once its DRA driver answered the kubelet as ``counts`` say
        (prepared=1 and so on); the sim's tallies in the same snapshot."""
        wanted = {{"prepared": PREPARED, "unprepared": UNPREPARED}[k]: n for k, n in counts.items()}

        def holds(s: dict[str, Any]) -> bool:
            calls = s["dra"][GPU_DRIVER]["kubelet"]["calls"]
            return all(calls.get(k, 0) == n for k, n in wanted.items())

        return await self.status(holds, f"the kubelet's calls are {wanted}")


def sim_calls(status: dict[str, Any]) -> dict[str, int]:
    calls = status["drivers"]["sim"]["calls"]
    return {m: t["ok"] for m, t in calls.items() if m != "list_devices"}


@asynccontextmanager
async def kubelet(plane: ControlPlane, folder: Path) -> AsyncIterator[Kubelet]:
    """devshim serving the sim's GPUs as DRA driver gpu.example.com, and the release's DRA manager
    started for NODE on devshim's plugins_registry and CDI dir, with devshim registered."""
    path = folder / "devshim.yaml"
    if not path.exists():
        config(folder, plane, NODE, SIM_GPUS)
    (folder / "manager-state").mkdir(exist_ok=True)
    (folder / "registry").mkdir(exist_ok=True)
    log = folder / "dramanager.log"
    try:
        async with (
            running_devshim(path) as (proc, port),
            running_dra_manager(plane.release, build(plane.release), log) as manager,
        ):
            await manager.start(
                plane.admin_kubeconfig, NODE, folder / "manager-state", folder / "registry", [folder / "cdi"]
            )
            node = Kubelet(plane, folder, manager, port, proc)
            await manager.registered(GPU_DRIVER)
            await node.status(lambda s: s["dra"][GPU_DRIVER]["kubelet"]["registered"] is True, "registered")
            yield node
    except BaseException:
        print(f"--- {log}, the end:\n{log.read_text(errors='replace')[-6000:] if log.exists() else ''}")
        raise


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


async def allocate(node: Kubelet, name: str, devices: list[str], pods: list[Pod]) -> dict[str, Any]:
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
        status = await node.kubelet_calls(prepared=1)
        assert status["dra"][GPU_DRIVER]["kubelet"]["service"] == expected_service(plane.minor)
        assert sim_calls(status) == {"allocate": 1, "prestart": 1}
        await node.manager.unprepare(pod.uid)
        status = await node.kubelet_calls(prepared=1, unprepared=1)
        assert sim_calls(status) == {"allocate": 1, "prestart": 1, "deallocate": 1}
        assert not list((folder / "cdi").glob("*.json"))


async def test_a_claim_shared_by_two_pods_is_prepared_once_and_unprepared_after_the_last(
    plane: ControlPlane, folder: Path, request: pytest.FixtureRequest
) -> None:
    newest_only(request, plane)
    async with kubelet(plane, folder) as node:
        first, second = pod_using("shared"), pod_using("shared")
        claim = await allocate(node, "shared", ["gpu-1"], [first, second])
        await node.manager.prepare(first)
        await node.manager.prepare(second)
        ids = {(await node.manager.resources(p.uid, "c0")).cdi_devices for p in (first, second)}
        assert ids == {(f"{GPU_DRIVER}/claim={claim['metadata']['uid']}-0",)}
        await node.manager.unprepare(first.uid)
        status = await node.kubelet_calls(prepared=1)
        assert "deallocate" not in sim_calls(status), "still used by the second pod"
        await node.manager.unprepare(second.uid)
        status = await node.kubelet_calls(prepared=1, unprepared=1)
        assert sim_calls(status) == {"allocate": 1, "prestart": 1, "deallocate": 1}


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
        status = await node.kubelet_calls(prepared=2)
        assert sim_calls(status) == {"allocate": 1, "prestart": 1}, "answered from the checkpoint"
        os.kill(node.proc.pid, signal.SIGKILL)
        await node.proc.wait()
        # devshim's restart: a new process (fresh tallies), the same folders and manager.
        async with running_devshim(folder / "devshim.yaml") as (proc, port):
            again = Kubelet(plane, folder, node.manager, port, proc)
            await again.status(lambda s: s["dra"][GPU_DRIVER]["kubelet"]["registered"] is True, "registered")
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
            status = await again.kubelet_calls(unprepared=1)
            assert sim_calls(status) == {"deallocate": 1}
            assert not list((folder / "cdi").glob("*.json"))


async def test_a_device_health_change_reaches_the_pod_status(
    plane: ControlPlane, folder: Path, request: pytest.FixtureRequest
) -> None:
    """Through DRAResourceHealth: v1alpha1 at 1.34 (dialled whatever is listed), v1 at 1.37 (the
    first of devshim's list it knows); 1.33's manager has no health."""
    newest_only(request, plane)
    async with kubelet(plane, folder) as node:
        # 1.34 finds a claim's health only when the pod's claim entry bears the claim's own name.
        pod = pod_using("watched")
        claim = await allocate(node, "watched", ["gpu-2"], [pod])
        cdi_id = f"{GPU_DRIVER}/claim={claim['metadata']['uid']}-0"
        await node.manager.prepare(pod)
        if plane.minor == 33:
            assert not (await node.manager.health(pod.uid)).supported
            return
        await until_health(node.manager, pod.uid, {cdi_id: "Healthy"})
        await control(folder, "health example.com/gpu gpu-2 Unhealthy")
        await until_health(node.manager, pod.uid, {cdi_id: "Unhealthy"})
        health = "v1alpha1" if plane.minor == 34 else "v1"
        status = await node.status(
            lambda s: s["dra"][GPU_DRIVER]["kubelet"]["health_service"] is not None, "health"
        )
        assert status["dra"][GPU_DRIVER]["kubelet"]["health_service"] == f"{health}.DRAResourceHealth"


async def until_health(
    manager: DraManager, pod_uid: str, wanted: dict[str, str], timeout: float = 60
) -> None:
    last = None
    try:
        async with asyncio.timeout(timeout):
            while (last := (await manager.health(pod_uid)).health_of("c0")) != wanted:
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"the pod's health never became {wanted}; last {last}") from None

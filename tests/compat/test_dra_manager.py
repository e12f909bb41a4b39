"""The DRA manager judge (shim.compat.upstream.dra_manager): the kubelet's real DRA manager and
plugin manager of 1.33, 1.34 and 1.37, each with a control plane of the same release, against the
scripted DRA plugin (tests/support/dra_plugin.py), so the harness is tested without devshim.

A ResourceClaim is written as the scheduler would (created, then its status: the allocation and
the pod it is reserved for), in the resource.k8s.io version that release's kubelet reads
(v1beta1 at 1.33, v1 after). By default only the harness's own checks run (devshim under the
judge, tests/compat/test_dra_judge.py, covers every release); --full-matrix adds the scripted
plugin's cells at 1.33, 1.34 and 1.37. No root is
needed: the harness takes every path it uses. Go builds each dramanager, kube-apiserver and
etcd (minutes cold, once; seconds from Go's caches).
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases as upstream
from shim.compat.upstream.dra_manager import (
    Container,
    ContainerClaim,
    DraManager,
    DraManagerError,
    Pod,
    PodClaim,
    checkpoint,
    running_dra_manager,
)
from tests.support import control_plane
from tests.support.dra_judge import CLAIMS_VERSION, RELEASES, build, param
from tests.support.dra_plugin import DraPlugin, cdi_id, running_dra_plugin
from tests.support.unix import short_temp_dir

DRIVER = "gpu.example.com"
NODE = "node-a"
DEVICE = "gpu-0"
DEFAULT = (RELEASES[-1],)  # the newest; --full-matrix adds the others
BOTH = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


@pytest.mark.timeout(upstream.BUILD_TIMEOUT_S * 2)
def test_the_dramanagers_build(request: pytest.FixtureRequest) -> None:
    """First, so a cold build (minutes) has its own timeout: each release's dramanager links the
    k8s.io/kubernetes its go.mod pins."""
    assert [r.minor for r in RELEASES] == [33, 34, 37]
    for release in RELEASES if request.config.getoption("--full-matrix") else DEFAULT:
        binary = build(release)
        done = subprocess.run(
            [str(binary)], input='{"id":1,"op":"version"}\n', capture_output=True, text=True, timeout=60,
            check=True,
        )  # fmt: skip
        assert done.stdout.strip() == f'{{"id":1,"ok":true,"result":{{"release":"{release.version}"}}}}'


async def test_the_dramanager_refuses_bad_requests_and_keeps_answering() -> None:
    """A request it cannot serve gets an error reply naming it, and it keeps answering; a start
    without a kubeconfig is refused before anything starts."""
    release = DEFAULT[0]
    with short_temp_dir("ds-dram-") as folder:
        async with running_dra_manager(release, build(release), folder / "dramanager.log") as manager:
            assert await manager.version() == release.version
            with pytest.raises(DraManagerError, match="prepare before start"):
                await manager.prepare(new_pod("c"))
            with pytest.raises(DraManagerError, match='unknown op "launch"'):
                await manager.call("launch")
            with pytest.raises(DraManagerError, match="start: no kubeconfig"):
                await manager.call("start", node_name=NODE)
            assert await manager.registrations() == []


def test_pod_wire_form() -> None:
    """The harness reads pods in this form (judges/dra/protocol.go)."""
    pod = Pod(
        "u", "p",
        resource_claims=[PodClaim("a", resource_claim_name="claim-a"),
                         PodClaim("b", resource_claim_template_name="t", generated_name="p-b-x1")],
        containers=[Container("c", [ContainerClaim("a"), ContainerClaim("b", request="r")])],
    )  # fmt: skip
    assert pod.wire() == {
        "uid": "u", "name": "p", "namespace": "default",
        "resource_claims": [
            {"name": "a", "resource_claim_name": "claim-a"},
            {"name": "b", "resource_claim_template_name": "t", "generated_name": "p-b-x1"},
        ],
        "init_containers": [],
        "containers": [{"name": "c", "claims": [{"name": "a"}, {"name": "b", "request": "r"}]}],
    }  # fmt: skip


# The scripted plugin's cells run with --full-matrix: by default the judge is exercised by
# tests/compat/test_dra_judge.py, with devshim as the plugin, at every release.
@pytest.fixture(scope="module", params=[param(r, ()) for r in RELEASES])
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """One control plane per release, with the node the manager runs on."""
    release: upstream.Release = request.param
    build(release)
    with control_plane.running(release) as plane:
        plane.ensure("/api/v1/nodes", {"metadata": {"name": NODE}})
        yield plane


@dataclass
class Node:
    """One kubelet's worth: the manager, the plugin, the folders they share."""

    manager: DraManager
    plugin: DraPlugin
    folder: Path

    @property
    def state_dir(self) -> Path:
        return self.folder / "state"


@asynccontextmanager
async def node(plane: ControlPlane, script: dict[str, Any] | None = None) -> AsyncIterator[Node]:
    """The release's DRA manager started for NODE and the scripted plugin registered with it."""
    release = plane.release
    with short_temp_dir("ds-dram-") as folder:
        registry, state = folder / "plugins_registry", folder / "state"
        registry.mkdir()
        state.mkdir()
        log = folder / "dramanager.log"
        try:
            async with running_dra_manager(release, build(release), log) as manager:
                await manager.start(
                    plane.admin_kubeconfig, NODE, state, registry, [folder / "plugin" / "cdi"]
                )
                async with running_dra_plugin(folder / "plugin", DRIVER, NODE, registry, script) as plugin:
                    await manager.registered(DRIVER)
                    yield Node(manager, plugin, folder)
        except BaseException:
            print(f"--- {log}, the end:\n{log.read_text(errors='replace')[-6000:]}")
            raise


def new_pod(claim: str) -> Pod:
    """A pod whose container `main` uses all of ResourceClaim `claim` (pod claim `gpu`)."""
    return Pod(
        uid=str(uuid.uuid4()),
        name=f"pod-{claim}",
        resource_claims=[PodClaim("gpu", resource_claim_name=claim)],
        containers=[Container("main", [ContainerClaim("gpu")]), Container("sidecar")],
    )


def allocated_claim(plane: ControlPlane, name: str, pod: Pod | None, request: str = "gpu") -> dict[str, Any]:
    """ResourceClaim `name` in the default namespace, allocated DEVICE of NODE's pool and (with a
    pod) reserved for it, written as the scheduler would: created, then its status."""
    version = CLAIMS_VERSION[plane.minor]
    # v1beta1 names the class on the request; v1 under `exactly` (a request of one kind).
    exact = {"deviceClassName": DRIVER}
    device_request = (
        {"name": request, **exact} if version == "v1beta1" else {"name": request, "exactly": exact}
    )
    path = f"/apis/resource.k8s.io/{version}/namespaces/default/resourceclaims"
    claim = plane.request("POST", path, {
        "apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaim",
        "metadata": {"name": name}, "spec": {"devices": {"requests": [device_request]}},
    })  # fmt: skip
    claim["status"] = {
        "allocation": {
            "devices": {"results": [{"request": request, "driver": DRIVER, "pool": NODE, "device": DEVICE}]}
        },
        "reservedFor": [{"resource": "pods", "name": pod.name, "uid": pod.uid}] if pod else [],
    }
    return dict(plane.request("PUT", f"{path}/{name}/status", claim))


@pytest.mark.parametrize("listed", [BOTH, BOTH[::-1]], ids=["v1-first", "v1beta1-first"])
async def test_the_plugin_registers_and_is_called_in_the_version_the_kubelet_chose(
    plane: ControlPlane, listed: list[str]
) -> None:
    """The plugin manager validates and registers the plugin with the versions it listed, and the
    manager then calls it in the version it chose: 1.33 knows only v1beta1 (of these), 1.34 and
    1.37 take the first of the plugin's list they know."""
    async with node(plane, {"versions": listed}) as n:
        calls = [(c.op, c.driver, c.endpoint, c.versions, c.error) for c in await n.manager.registrations()]
        assert calls == [
            ("validate", DRIVER, str(n.plugin.socket), tuple(listed), ""),
            ("register", DRIVER, str(n.plugin.socket), tuple(listed), ""),
        ]
        await n.plugin.until(
            lambda calls: any(c.get("method") == "NotifyRegistrationStatus" for c in calls), "it was told"
        )
        assert n.plugin.methods("NotifyRegistrationStatus")[0]["registered"] is True
        pod = new_pod(f"claim-{uuid.uuid4().hex[:8]}")
        claim = allocated_claim(plane, pod.resource_claims[0].resource_claim_name, pod)
        await n.manager.prepare(pod)
        chosen = "v1beta1.DRAPlugin" if plane.minor == 33 else listed[0]
        prepared = n.plugin.methods("NodePrepareResources")
        assert [(c["service"], c["claims"]) for c in prepared] == [
            (
                chosen,
                [
                    {
                        "uid": claim["metadata"]["uid"],
                        "name": claim["metadata"]["name"],
                        "namespace": "default",
                    }
                ],
            )
        ]


async def test_a_claim_prepared_resolves_survives_a_restart_and_is_unprepared(plane: ControlPlane) -> None:
    """Prepared, the container using the claim gets its CDI device, which the CDI library turns
    into the env, device node and mount the plugin's spec holds; the other container gets nothing.
    The manager checkpoints it; a kubelet restart keeps it (GetResources answers from the
    checkpoint), though the pod's next sync prepares it again (the restored claim is not marked
    prepared: a plugin must answer a repeated prepare); unpreparing after the restart reaches the
    plugin, which removes the spec."""
    async with node(plane) as n:
        pod = new_pod(f"claim-{uuid.uuid4().hex[:8]}")
        claim = allocated_claim(plane, pod.resource_claims[0].resource_claim_name, pod)
        uid = claim["metadata"]["uid"]
        await n.manager.prepare(pod)
        got = await n.manager.resources(pod.uid, "main")
        assert got.cdi_devices == (cdi_id(DRIVER, uid),)
        assert got.cdi_error == ""
        assert got.env_map == {"FOO": uid, "DEVSHIM_TEST_DEVICE": DEVICE}
        assert [(d.path, d.type, d.major, d.minor) for d in got.devices] == [
            (f"/dev/devshim-test-{DEVICE}", "c", 1, 3)
        ]
        assert [(m.source, m.destination, m.options) for m in got.mounts] == [
            (str(n.plugin.cdi_dir), "/run/devshim-test", ("ro", "bind"))
        ]
        assert (await n.manager.resources(pod.uid, "sidecar")).cdi_devices == ()
        assert [(c["ClaimUID"], list(c["PodUIDs"])) for c in checkpoint(n.state_dir)] == [(uid, [pod.uid])]

        pid = n.manager.pid
        await n.manager.restart()
        assert n.manager.pid == pid  # the same process, a fresh image
        await n.manager.registered(DRIVER)
        assert (await n.manager.resources(pod.uid, "main")).cdi_devices == (cdi_id(DRIVER, uid),)
        # The pod synced again after the restart: the claims restored from the checkpoint are
        # not marked prepared, so the plugin is asked again, for the same claim.
        await n.manager.prepare(pod)
        prepared = n.plugin.methods("NodePrepareResources")
        assert [[c["uid"] for c in call["claims"]] for call in prepared] == [[uid], [uid]]
        assert (await n.manager.resources(pod.uid, "main")).env_map["FOO"] == uid

        await n.manager.unprepare(pod.uid)
        unprepared = n.plugin.methods("NodeUnprepareResources")
        assert [[c["uid"] for c in call["claims"]] for call in unprepared] == [[uid]]
        assert not n.plugin.spec(uid).exists()
        assert checkpoint(n.state_dir) == []
        with pytest.raises(DraManagerError, match="no active pod"):
            await n.manager.resources(pod.uid, "main")


async def test_the_health_the_plugin_reports_reaches_the_pod_status(plane: ControlPlane) -> None:
    """The plugin streams its device Healthy; the manager reports it in the status of the
    container using the claim, by CDI ID. 1.33's manager has no health. 1.34's finds a claim's
    health only when the pod's claim entry bears the ResourceClaim's own name (it compares the
    two); 1.37 resolves the name, so a pod claim named otherwise is reported too."""
    script = {"versions": [*BOTH, "v1.DRAResourceHealth"], "health": "HEALTHY"}
    async with node(plane, script) as n:
        same = f"claim-{uuid.uuid4().hex[:8]}"
        named = Pod(
            uid=str(uuid.uuid4()),
            name=f"pod-{same}",
            resource_claims=[PodClaim(same, resource_claim_name=same)],
            containers=[Container("main", [ContainerClaim(same)])],
        )
        other = new_pod(f"claim-{uuid.uuid4().hex[:8]}")
        ids = {}
        for pod in (named, other):
            claim = allocated_claim(plane, pod.resource_claims[0].resource_claim_name, pod)
            ids[pod.uid] = cdi_id(DRIVER, claim["metadata"]["uid"])
            await n.manager.prepare(pod)
        if plane.minor == 33:
            assert not (await n.manager.health(named.uid)).supported
            return
        await until_healthy(n.manager, named.uid, ids[named.uid])
        status = (await n.manager.health(named.uid)).containers["main"]
        assert status == [
            {"name": f"claim:{same}", "resources": [{"resourceID": ids[named.uid], "health": "Healthy"}]}
        ]
        if plane.minor == 34:
            assert (await n.manager.health(other.uid)).health_of("main") == {}
        else:
            await until_healthy(n.manager, other.uid, ids[other.uid])


async def until_healthy(manager: DraManager, pod_uid: str, resource: str, timeout: float = 30) -> None:
    """Wait until the manager reports `resource` of the pod's `main` container Healthy (the
    health stream's first message arrives in its own time)."""
    last = None
    try:
        async with asyncio.timeout(timeout):
            while (last := (await manager.health(pod_uid)).health_of("main")) != {resource: "Healthy"}:
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{resource} never reported Healthy; the last health was {last}") from None


async def test_a_pod_the_claim_is_not_reserved_for_is_refused(plane: ControlPlane) -> None:
    """The manager refuses a pod not in the claim's reservedFor, with its own error text, and
    never calls the plugin; a claim that does not exist, or a template's claim the pod does not
    own, is refused likewise."""
    async with node(plane) as n:
        pod = new_pod(f"claim-{uuid.uuid4().hex[:8]}")
        allocated_claim(plane, pod.resource_claims[0].resource_claim_name, None)
        with pytest.raises(DraManagerError, match="is not allowed to use"):
            await n.manager.prepare(pod)
        missing = new_pod(f"missing-{uuid.uuid4().hex[:8]}")
        with pytest.raises(DraManagerError, match="not found"):
            await n.manager.prepare(missing)
        # A claim from a template is the pod's only if the pod owns it (the claim controller
        # makes it so); this one, reserved for the pod but made by hand, is not.
        generated = f"generated-{uuid.uuid4().hex[:8]}"
        from_template = PodClaim("gpu", resource_claim_template_name="gpu-template", generated_name=generated)
        templated = Pod(str(uuid.uuid4()), f"pod-{generated}", [from_template], [Container("main")])
        allocated_claim(plane, generated, templated)
        with pytest.raises(DraManagerError, match="(?i)was not created for pod"):
            await n.manager.prepare(templated)
        assert n.plugin.methods("NodePrepareResources") == []

"""The rows of `devshim compat --dra`: what a release's real DRA manager, with a real API server,
must see of devshim serving a driver's devices as a DRA driver (docs/compat.md, "DRA").

Each scenario runs in a fresh world (dra_world.dra_node): devshim with the driver under test, the
kubelet release's DRA manager, both on a new node of the column's API server. The scenario plays
the scheduler from the published pool; it knows nothing of the driver but what devshim publishes,
so any driver can be judged.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from shim.compat.dra_world import DraNode, Published, allocate_claim, dra_node, running_devshim
from shim.compat.node import ControlPlane
from shim.compat.results import Failed, expect
from shim.compat.upstream.dra_manager import Container, ContainerClaim, DraManagerError, Pod, PodClaim
from shim.compat.upstream.releases import Release

# What devshim registers, newest first (shim.dra.plugin.server SERVICES).
OFFERED = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
PREPARED, UNPREPARED = "NodePrepareResources ok", "NodeUnprepareResources ok"


def claims_version(kubelet_minor: int) -> str:
    """The resource.k8s.io version the release's DRA manager reads claims through
    (pkg/kubelet/cm/dra/manager.go: ResourceV1beta1() at 1.33, ResourceV1() after)."""
    return "v1beta1" if kubelet_minor == 33 else "v1"


def chosen_service(kubelet_minor: int) -> str:
    """The DRAPlugin version the release takes from devshim's list: 1.33 knows only v1beta1 of
    it; later releases take the first they know (pkg/kubelet/cm/dra/plugin)."""
    return "v1beta1.DRAPlugin" if kubelet_minor == 33 else "v1.DRAPlugin"


@dataclass
class DraCell:
    """One cell's setting: the column's API server and kubelet release, the devshim config to
    run (its driver and the DRA driver it serves), a folder of its own."""

    plane: ControlPlane
    kubelet: Release
    manager_binary: Path
    settings: dict[str, Any]  # devshim's, its folders and node filled in by `write_config`
    driver: str  # the DRA driver name
    folder: Path
    node: str

    def write_config(self) -> Path:
        dra = {
            **self.settings.get("dra", {}),
            "plugins_dir": str(self.folder / "plugins"),
            "cdi_dir": str(self.folder / "cdi"),
            "node_name": self.node,
            "kubeconfig": str(self.plane.admin_kubeconfig),
        }
        settings = {
            **self.settings,
            "device_plugins_dir": str(self.folder / "dp"),
            "plugins_registry_dir": str(self.folder / "registry"),
            "state_dir": str(self.folder / "state"),
            "dra": dra,
        }
        path = self.folder / "devshim.yaml"
        path.write_text(yaml.safe_dump(settings))
        return path

    def world(self) -> AbstractAsyncContextManager[DraNode]:
        """devshim and the DRA manager on this cell's node (dra_world.dra_node)."""
        self.plane.ensure("/api/v1/nodes", {"metadata": {"name": self.node}})
        return dra_node(
            self.plane, self.kubelet, self.manager_binary, self.folder, self.write_config(),
            node=self.node, driver=self.driver,
        )  # fmt: skip

    def pool_resources(self) -> list[str]:
        [pool] = [d for d in self.settings["dra"]["drivers"] if d["name"] == self.driver]
        return list(pool["resources"])

    def published(self) -> Published:
        version = self.plane.served_versions("resource.k8s.io")[0]
        return Published(self.plane, version, self.node, self.driver)


def _pod(claim: str) -> Pod:
    return Pod(
        uid=str(uuid.uuid4()),
        name=f"pod-{claim}",
        resource_claims=[PodClaim(claim, resource_claim_name=claim)],
        containers=[Container("c0", [ContainerClaim(claim)])],
    )


async def _claim_one(cell: DraCell, node: DraNode, name: str) -> tuple[Pod, dict[str, Any]]:
    """A claim of the pool's first device, reserved for a new pod, as the scheduler leaves it."""
    pool = await cell.published().until(lambda pool: len(pool) > 0, "devshim published a device")
    pod = _pod(name)
    claim = allocate_claim(
        cell.plane, claims_version(cell.kubelet.minor), name, [("r0", sorted(pool)[0])],
        node=cell.node, driver=cell.driver, pods=[(pod.name, pod.uid)],
    )  # fmt: skip
    return pod, claim


async def _prepared(cell: DraCell, node: DraNode, name: str) -> tuple[Pod, str]:
    """A claim prepared by the DRA manager and resolved by the CDI library: the pod and the
    claim's uid."""
    pod, claim = await _claim_one(cell, node, name)
    await node.manager.prepare(pod)
    got = await node.manager.resources(pod.uid, "c0")
    expect(got.cdi_error == "", f"the CDI library could not resolve devshim's answer: {got.cdi_error}")
    return pod, str(claim["metadata"]["uid"])


def _spec(cell: DraCell, uid: str) -> Path:
    return cell.folder / "cdi" / f"devshim-{cell.driver}-{uid}.json"


def _driver_calls(status: dict[str, Any], method: str) -> int:
    return sum(d.get("calls", {}).get(method, {}).get("ok", 0) for d in status["drivers"].values())


async def register(cell: DraCell) -> str:
    async with cell.world() as node:
        registrations = [r for r in await node.manager.registrations() if r.op == "register"]
        expect(len(registrations) == 1, f"the plugin manager registered {len(registrations)} times")
        [got] = registrations
        expect(got.versions == OFFERED, f"devshim offered {got.versions}, not {OFFERED}")
        where = str(cell.folder / "plugins" / cell.driver / "dra.sock")
        expect(got.endpoint == where, f"the endpoint is {got.endpoint}, not {where}")
        return f"offered {', '.join(got.versions)}"


async def publish(cell: DraCell) -> str:
    """Every device devshim serves of the pool's resources is published, the pool complete."""
    resources = cell.pool_resources()

    def served(status: dict[str, Any]) -> int:
        found = [status["resources"][r]["devices"] for r in resources if r in status["resources"]]
        return sum(d["Healthy"] + d["Unhealthy"] for d in found) if len(found) == len(resources) else -1

    async with cell.world() as node:
        status = await node.devshim.status(
            lambda s: served(s) > 0 and s["dra"][cell.driver]["devices"] == served(s),
            f"devshim has published every device of {', '.join(resources)}",
        )
        count = served(status)
        pool = await cell.published().until(
            lambda pool: len(pool) == count, f"the {count} devices are published"
        )
        return f"{len(pool)} devices in resource.k8s.io/{cell.published().version}"


async def prepare(cell: DraCell) -> str:
    async with cell.world() as node:
        pod, uid = await _prepared(cell, node, "prepared")
        status = await node.kubelet_status(lambda k: k["calls"].get(PREPARED) == 1, "one claim prepared")
        service = status["dra"][cell.driver]["kubelet"]["service"]
        wanted = chosen_service(cell.kubelet.minor)
        expect(service == wanted, f"the DRA manager called {service}, not {wanted}")
        await node.manager.unprepare(pod.uid)
        await node.kubelet_status(lambda k: k["calls"].get(UNPREPARED) == 1, "the claim unprepared")
        expect(not _spec(cell, uid).exists(), "devshim's CDI spec is still there after unprepare")
        return f"through {service}"


async def shared(cell: DraCell) -> str:
    """A claim reserved for two pods: prepared once, still resolving for the second pod after the
    first is gone, unprepared once after the last."""
    async with cell.world() as node:
        pool = await cell.published().until(lambda pool: len(pool) > 0, "devshim published a device")
        first, second = _pod("shared"), _pod("shared")
        second = Pod(second.uid, "pod-shared-2", second.resource_claims, second.containers)
        allocate_claim(
            cell.plane, claims_version(cell.kubelet.minor), "shared", [("r0", sorted(pool)[0])],
            node=cell.node, driver=cell.driver, pods=[(p.name, p.uid) for p in (first, second)],
        )  # fmt: skip
        await node.manager.prepare(first)
        await node.manager.prepare(second)
        ids = {(await node.manager.resources(p.uid, "c0")).cdi_devices for p in (first, second)}
        expect(len(ids) == 1, f"the two pods of one claim got different CDI devices: {sorted(ids)}")
        status = await node.kubelet_status(lambda k: k["prepared_claims"] == 1, "one claim prepared")
        asked = _driver_calls(status, "allocate")
        expect(asked == 1, f"the driver was asked to allocate {asked} times for one claim")
        await node.manager.unprepare(first.uid)
        got = await node.manager.resources(second.uid, "c0")
        expect(got.cdi_error == "", f"the second pod's devices no longer resolve: {got.cdi_error}")
        await node.manager.unprepare(second.uid)
        await node.kubelet_status(
            lambda k: k["calls"].get(UNPREPARED) == 1 and k["prepared_claims"] == 0, "unprepared once"
        )
        return "prepared once for two pods, unprepared after the last"


async def kubelet_restart(cell: DraCell) -> str:
    async with cell.world() as node:
        pod, _ = await _prepared(cell, node, "survivor")
        await node.manager.restart()
        await node.manager.registered(cell.driver)
        await node.manager.prepare(pod)  # the pod's next sync after a kubelet restart
        status = await node.kubelet_status(lambda k: k["calls"].get(PREPARED) == 2, "prepared again")
        asked = _driver_calls(status, "allocate")
        expect(
            asked == 1, f"the driver was asked to allocate {asked} times: not answered from the checkpoint"
        )
        await node.manager.unprepare(pod.uid)
        return "prepared again from devshim's checkpoint"


async def devshim_restart(cell: DraCell) -> str:
    """devshim SIGKILLed between prepare and unprepare, then started again on the same state."""
    async with cell.world() as node:
        pod, uid = await _prepared(cell, node, "kept")
        await node.devshim.kill()
        async with running_devshim(cell.folder / "devshim.yaml") as again:
            restarted = DraNode(cell.plane, cell.folder, cell.node, cell.driver, node.manager, again)
            await restarted.registered()
            got = await node.manager.resources(pod.uid, "c0")
            expect(got.cdi_error == "", f"after the restart the CDI library fails: {got.cdi_error}")
            await _unprepare_retrying(node, pod.uid)
            expect(not _spec(cell, uid).exists(), "devshim's CDI spec is still there after unprepare")
        return "unprepared by the restarted devshim"


async def _unprepare_retrying(node: DraNode, pod_uid: str, timeout: float = 30) -> None:
    """As the kubelet retries an unprepare that fails while the restarted driver is not up yet."""
    last = ""
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await node.manager.unprepare(pod_uid)
                    return
                except DraManagerError as refused:
                    last = str(refused)
                    await asyncio.sleep(0.1)
    except TimeoutError:
        raise Failed(f"unprepare kept failing for {timeout:g} s: {last}") from None


SCENARIOS: dict[str, Callable[[DraCell], Awaitable[str]]] = {
    "register": register,
    "publish": publish,
    "prepare": prepare,
    "shared": shared,
    "kubelet_restart": kubelet_restart,
    "devshim_restart": devshim_restart,
}

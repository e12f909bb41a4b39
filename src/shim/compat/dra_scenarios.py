"""The rows of `devshim compat --dra`: what a release's real DRA manager, with a real API server,
must see of devshim serving a driver's devices as a DRA driver (docs/compat.md, "DRA").

Each scenario runs in a fresh world (dra_world.dra_node): devshim with the driver under test, the
kubelet release's DRA manager, both on a new node of the column's API server. The scenario plays
the scheduler from the published pool; it knows nothing of the driver but what devshim publishes,
so any driver can be judged.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shim.compat.dra_world import (
    DraNode,
    Published,
    allocate_claim,
    claim_pod,
    dra_node,
    running_devshim,
    unprepare_retrying,
)
from shim.compat.driver_world import run_health_hook
from shim.compat.plain import listing
from shim.compat.realnode import ControlPlane
from shim.compat.realnode.controlplane import apiserver_releases
from shim.compat.results import Failed, Skip, expect
from shim.compat.upstream.dra_manager import (
    DraManager,
    Pod,
)
from shim.compat.upstream.releases import Release
from shim.dra.checkpoint import Checkpoint

# What devshim registers, newest first (shim.dra.plugin.server SERVICES).
OFFERED = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
PREPARED, UNPREPARED = "NodePrepareResources ok", "NodeUnprepareResources ok"


def claims_version(kubelet_minor: int) -> str:
    """The resource.k8s.io version the release's DRA manager reads claims through
    (pkg/kubelet/cm/dra/manager.go: ResourceV1beta1() at 1.33, ResourceV1() after)."""
    return "v1beta1" if kubelet_minor == 33 else "v1"


def known_services(kubelet_minor: int) -> tuple[str, ...]:
    """The DRAPlugin versions the release's plugin handler accepts (pkg/kubelet/cm/dra/plugin:
    1.33 speaks v1beta1 only; v1 came in 1.34)."""
    return ("v1beta1.DRAPlugin",) if kubelet_minor == 33 else ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def chosen_service(kubelet_minor: int, versions: Sequence[str]) -> str:
    """The service the release calls. From 1.34 the first of the plugin's list it knows
    (validateSupportedServices, pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go); 1.33 goes by
    its own list, falling back to v1alpha4.Node, which plugins of then did not advertise
    (registration.go)."""
    if kubelet_minor == 33:
        return next((s for s in ("v1beta1.DRAPlugin", "v1alpha4.Node") if s in versions), "v1alpha4.Node")
    return next((v for v in versions if v in known_services(kubelet_minor)), "none")


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
    # A shell command that makes DEVSHIM_COMPAT_DEVICE of DEVSHIM_COMPAT_RESOURCE Unhealthy (as
    # for the device-plugin matrix), with the driver's env; without it the health row is skipped.
    health_hook: str | None = None
    hook_env: Mapping[str, str] = field(default_factory=dict)

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
            "cdi_dir": str(self.folder / "cdi"),  # specs the driver ships, beside the claims'
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
        return Published.newest(self.plane, self.node, self.driver)


async def _claim_one(cell: DraCell, node: DraNode, name: str) -> tuple[Pod, dict[str, Any]]:
    """A claim of the pool's first device, reserved for a new pod, as the scheduler leaves it."""
    pool = await cell.published().until(lambda pool: len(pool) > 0, "devshim published a device")
    pod = claim_pod(name)
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


def resource_versions(kubelet: Release, server_minor: int) -> tuple[str, ...]:
    """The resource.k8s.io versions a server must serve besides its defaults for this kubelet's
    DRA manager: v1beta1, which 1.33 reads claims through, is off by default from 1.34."""
    return ("v1beta1",) if claims_version(kubelet.minor) == "v1beta1" and server_minor >= 34 else ()


def _driver_calls(status: dict[str, Any], method: str) -> int:
    return sum(d.get("calls", {}).get(method, {}).get("ok", 0) for d in status["drivers"].values())


async def register(cell: DraCell) -> str:
    async with cell.world() as node:
        registrations = [r for r in await node.manager.registrations() if r.op == "register"]
        expect(len(registrations) == 1, f"the plugin manager registered {len(registrations)} times")
        [got] = registrations
        expect(got.versions == OFFERED, f"devshim offered {listing(got.versions)}, not {listing(OFFERED)}")
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
        wanted = chosen_service(cell.kubelet.minor, OFFERED)
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
        first, second = claim_pod("shared"), claim_pod("shared")
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
            await unprepare_retrying(node.manager, pod.uid)
            expect(not _spec(cell, uid).exists(), "devshim's CDI spec is still there after unprepare")
        return "unprepared by the restarted devshim"


async def health(cell: DraCell) -> str:
    """A prepared device the driver reports Unhealthy (through --health-hook) reaches the pod's
    status through DRAResourceHealth (1.34: v1alpha1, later v1)."""
    if cell.kubelet.minor == 33:
        raise Skip("the 1.33 DRA manager reads no device health")
    if cell.health_hook is None:
        raise Skip("give --health-hook to make a device Unhealthy")
    async with cell.world() as node:
        pod, uid = await _prepared(cell, node, "watched")
        await _until_health(node.manager, pod.uid, "Healthy")
        entry = Checkpoint(cell.folder / "state", cell.driver).get(uid)
        if entry is None or not entry.groups:
            raise Failed("devshim's checkpoint does not hold the prepared claim's devices")
        group = entry.groups[0]
        status = await node.devshim.status(
            lambda s: any(d["pid"] and group.resource in d["resources"] for d in s["drivers"].values()),
            f"the driver of {group.resource} runs",
        )
        pid = next(d["pid"] for d in status["drivers"].values() if group.resource in d["resources"])
        await run_health_hook(cell.health_hook, cell.hook_env, group.resource, group.device_ids[0], pid)
        await _until_health(node.manager, pod.uid, "Unhealthy")
        status = await node.kubelet_status(lambda k: k["health_service"] is not None, "a health stream")
        await node.manager.unprepare(pod.uid)
        service = status["dra"][cell.driver]["kubelet"]["health_service"]
        return f"Unhealthy in the pod's status through {service}"


async def _until_health(manager: DraManager, pod_uid: str, wanted: str, timeout: float = 60) -> None:
    """Until the DRA manager reports every device of the pod's container ``wanted``."""
    last: dict[str, str] = {}
    try:
        async with asyncio.timeout(timeout):
            while True:
                last = (await manager.health(pod_uid)).health_of("c0")
                if last and set(last.values()) == {wanted}:
                    return
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise Failed(f"the pod's devices never became {wanted} in its status; last {last}") from None


def upgrade_target(apiserver_minor: int, kubelet: Release) -> Release | None:
    """The next API server release carried, if upstream supports the kubelet with it (one minor
    at a time, at most three minors newer than the kubelet): the apiserver_upgrade row's."""
    after = [r for r in apiserver_releases() if r.minor == apiserver_minor + 1]
    return after[0] if after and after[0].minor <= kubelet.minor + 3 else None


async def apiserver_upgrade(cell: DraCell) -> str:
    """The API server upgraded one minor on the same etcd data between a claim's prepare and
    unprepare: devshim publishes in the new server's newest version with no device lost, the
    claim is unprepared, and a claim made after the upgrade is prepared."""
    target = upgrade_target(cell.plane.minor, cell.kubelet)
    if target is None:
        raise Skip(f"no API server 1.{cell.plane.minor + 1} is carried to upgrade to (one minor at a time)")
    also = resource_versions(cell.kubelet, target.minor)  # the kubelet's claims' version, after too
    plane = ControlPlane(cell.plane.minor, cell.folder / "plane", resource_versions=also)
    await asyncio.to_thread(plane.start)
    try:
        own = dataclasses.replace(cell, plane=plane)
        async with own.world() as node:
            pod, _ = await _prepared(own, node, "before")
            count = len(await own.published().until(lambda pool: len(pool) > 0, "devshim published"))
            await asyncio.to_thread(plane.upgrade, target.minor)
            newest = own.published().version
            publishing = f"devshim publishes in {newest}"
            await node.devshim.status(lambda s: s["dra"][own.driver]["version"] == newest, publishing, 90)
            await own.published().until(lambda pool: len(pool) == count, f"all {count} devices in {newest}")
            await node.manager.unprepare(pod.uid)
            after, _ = await _prepared(own, node, "after")
            await node.manager.unprepare(after.uid)
            return f"1.{cell.plane.minor} to 1.{target.minor}: {count} devices in {newest}"
    finally:
        await asyncio.to_thread(plane.stop)


SCENARIOS: dict[str, Callable[[DraCell], Awaitable[str]]] = {
    "register": register,
    "publish": publish,
    "prepare": prepare,
    "shared": shared,
    "kubelet_restart": kubelet_restart,
    "devshim_restart": devshim_restart,
    "health": health,
    "apiserver_upgrade": apiserver_upgrade,
}

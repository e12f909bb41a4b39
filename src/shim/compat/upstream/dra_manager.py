"""One running DRA manager harness: the kubelet's real DRA manager and plugin manager of a release.

The `dramanager` program of a release module (judges/k8s-1.NN/dramanager, over judges/dra) runs
k8s.io/kubernetes' pkg/kubelet/cm/dra manager and pkg/kubelet/pluginmanager as the kubelet
does, and reads one JSON request per line on stdin, answering one JSON reply per line on stdout
(judges/dra/protocol.go has the shapes); its klog output goes to a log file that a failure
quotes. Unlike the device manager it takes every path it uses (its state dir, the
plugins_registry it watches, the CDI spec dirs), so it needs no root and no mount namespace; it
reads ResourceClaims from a real API server through a kubeconfig (shim.compat.realnode.ControlPlane).

    async with running_dra_manager(release, binary, log) as manager:
        await manager.start(kubeconfig, "node-a", state_dir, plugins_dir, [cdi_dir])
        await manager.registered("gpu.example.com")
        await manager.prepare(pod)                       # DraManagerError: the manager's error
        got = await manager.resources(pod.uid, "main")   # CDI IDs, and the OCI edits they make
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shim.compat.results import Failed

from . import releases
from .judge_process import JudgePod, JudgeProcess, running_judge
from .releases import Release

# klog's verbosity for the log: 4 has each registration with the service the kubelet chose.
VERBOSITY = 4
# The manager's checkpoint in its state dir (pkg/kubelet/cm/dra: draManagerStateFileName).
CHECKPOINT = "dra_manager_state"


class DraManagerError(Failed):
    """The real manager refused a request (its error text) or the harness itself failed."""


def dra_releases() -> list[Release]:
    """The releases whose module carries the dramanager program, oldest first."""
    return [r for r in releases.releases() if r.carries(releases.DRAMANAGER_PROGRAM)]


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's spec.resourceClaims: a ResourceClaim by name, or one from a
    template, whose generated claim (status.resourceClaimStatuses) is `generated_name`."""

    name: str
    resource_claim_name: str = ""
    resource_claim_template_name: str = ""
    generated_name: str = ""

    def wire(self) -> dict[str, str]:
        out = {"name": self.name}
        for key in ("resource_claim_name", "resource_claim_template_name", "generated_name"):
            if value := getattr(self, key):
                out[key] = value
        return out


@dataclass(frozen=True)
class ContainerClaim:
    """One entry of a container's resources.claims: a pod claim, whole or one request of it."""

    name: str
    request: str = ""

    def wire(self) -> dict[str, str]:
        return {"name": self.name, "request": self.request} if self.request else {"name": self.name}


@dataclass(frozen=True)
class Container:
    name: str
    claims: Sequence[ContainerClaim] = ()

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "claims": [c.wire() for c in self.claims]}


@dataclass(frozen=True)
class Pod(JudgePod):
    """What the DRA manager reads of a pod: its resource claims, and its containers' claims."""

    uid: str
    name: str
    resource_claims: Sequence[PodClaim]
    containers: Sequence[Container]
    namespace: str = "default"
    init_containers: Sequence[Container] = ()

    def wire(self) -> dict[str, Any]:
        return {**super().wire(), "resource_claims": [c.wire() for c in self.resource_claims]}


@dataclass(frozen=True)
class Registration:
    """One call of the plugin manager on the DRA handler: "validate", "register" or
    "deregister", with the plugin's supported versions and what the handler returned."""

    op: str
    driver: str
    endpoint: str
    versions: tuple[str, ...]
    error: str

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Registration:
        return cls(raw["op"], raw["driver"], raw["endpoint"], tuple(raw.get("versions") or ()), raw["error"])


@dataclass(frozen=True)
class DeviceNode:
    """A linux.devices entry of the OCI spec the CDI devices made."""

    path: str
    type: str
    major: int
    minor: int
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True)
class Mount:
    destination: str
    source: str
    type: str = ""
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resources:
    """What the runtime gets for one container: the manager's CDI device IDs (GetResources),
    and the OCI spec edits the CDI library makes of them (empty, with `cdi_error`, when it
    cannot resolve them). `device_rules` and `hooks` are the raw OCI entries."""

    cdi_devices: tuple[str, ...]
    env: tuple[str, ...]
    devices: tuple[DeviceNode, ...]
    mounts: tuple[Mount, ...]
    device_rules: tuple[Mapping[str, Any], ...] = ()
    hooks: tuple[Mapping[str, Any], ...] = ()
    additional_gids: tuple[int, ...] = ()
    cdi_error: str = ""

    @property
    def env_map(self) -> dict[str, str]:
        """The env as a mapping (a later entry wins, as in a process's environment)."""
        return dict(entry.partition("=")[::2] for entry in self.env)

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Resources:
        return cls(
            cdi_devices=tuple(raw["cdi_devices"]),
            env=tuple(raw["env"]),
            devices=tuple(
                DeviceNode(d["path"], d["type"], d["major"], d["minor"], d["file_mode"], d["uid"], d["gid"])
                for d in raw["devices"]
            ),
            mounts=tuple(
                Mount(m["destination"], m["source"], m.get("type") or "", tuple(m.get("options") or ()))
                for m in raw["mounts"]
            ),
            device_rules=tuple(raw["device_rules"]),
            hooks=tuple(raw["hooks"]),
            additional_gids=tuple(raw["additional_gids"]),
            cdi_error=raw["cdi_error"],
        )


@dataclass(frozen=True)
class Health:
    """UpdateAllocatedResourcesStatus for a pod: each container's allocatedResourcesStatus as
    the Kubernetes API spells it ([{"name": "claim:gpu/req", "resources": [{"resourceID": ...,
    "health": "Healthy"}]}]), and the pods the manager's health updates named since it started.
    `supported` is False where the release's manager has no health (1.33)."""

    supported: bool
    containers: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    notified: tuple[str, ...] = ()

    def health_of(self, container: str) -> dict[str, str]:
        """The container's devices' health by resource ID, over all its claims."""
        return {
            r["resourceID"]: r.get("health", "")
            for status in self.containers.get(container, ())
            for r in status.get("resources") or ()
        }


class DraManager(JudgeProcess):
    """Requests to one DRA manager process (judges/dra)."""

    program = "dramanager"
    manager = "DRA manager"
    error = DraManagerError

    async def version(self) -> str:
        """The k8s.io/kubernetes release the program links ("v1.37.2")."""
        result: dict[str, str] = await self.call("version")
        return result["release"]

    async def start(
        self,
        kubeconfig: Path,
        node_name: str,
        state_dir: Path,
        plugins_dir: Path,
        cdi_dirs: Sequence[Path] = (),
        pods: Sequence[Pod] = (),
    ) -> dict[str, bool]:
        """The manager constructed on `state_dir` and started, reading claims through
        `kubeconfig` for node `node_name`, and the plugin manager watching `plugins_dir`; CDI
        IDs resolve against `cdi_dirs` only. `pods` are active from the start (a restarted
        kubelet's). Returns the feature gates the release set, as the gate now reads them."""
        result: dict[str, Any] = await self.call(
            "start",
            kubeconfig=str(kubeconfig),
            node_name=node_name,
            state_dir=str(state_dir),
            plugins_dir=str(plugins_dir),
            cdi_dirs=[str(d) for d in cdi_dirs],
            pods=[p.wire() for p in pods],
        )
        gates: dict[str, bool] = result["gates"]
        return gates

    async def registrations(self) -> list[Registration]:
        """Every call of the plugin manager on the DRA handler since start, in order."""
        return [Registration.from_wire(r) for r in await self.call("registrations")]

    async def registered(self, driver: str, timeout: float = 30.0) -> Registration:
        """The first accepted RegisterPlugin of `driver`, waited for (the plugin manager finds a
        new socket within a second or so); DraManagerError after `timeout`, naming the calls."""
        calls: list[Registration] = []
        try:
            async with asyncio.timeout(timeout):
                while True:
                    calls = await self.registrations()
                    for call in calls:
                        if call.op == "register" and call.driver == driver and not call.error:
                            return call
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise DraManagerError(
                f"{driver} did not register with the {self.release.name} DRA manager within {timeout:g} s; "
                f"the plugin manager's calls: {calls}{self.log_tail()}"
            ) from None

    async def prepare(self, pod: Pod) -> None:
        """PrepareResources for `pod`, active from now on (still, should it fail)."""
        await self.call("prepare", pod=pod.wire())

    async def resources(self, pod_uid: str, container: str) -> Resources:
        """GetResources for an active pod's container, and its CDI IDs resolved."""
        return Resources.from_wire(await self.call("resources", pod_uid=pod_uid, container=container))

    async def health(self, pod_uid: str) -> Health:
        got = await self.call("health", pod_uid=pod_uid)
        return Health(got["supported"], got["containers"], tuple(got["notified"]))

    async def unprepare(self, pod_uid: str) -> None:
        """UnprepareResources for an active pod, which is no longer active once it succeeded."""
        await self.call("unprepare", pod_uid=pod_uid)

    async def restart(self) -> None:
        """A kubelet restart: the process replaces itself with a fresh one, which starts a new
        manager and plugin manager on the same state dir with the same active pods."""
        await self.call("restart")


@asynccontextmanager
async def running_dra_manager(release: Release, binary: Path, log: Path) -> AsyncIterator[DraManager]:
    """A dramanager process of `release` (its klog to `log`), stopped (stop, then its process
    group ended) on the way out."""
    async with running_judge(DraManager, release, [str(binary), f"-v={VERBOSITY}"], log) as manager:
        yield manager


def checkpoint(state_dir: Path) -> list[dict[str, Any]]:
    """The claims the manager's checkpoint in `state_dir` holds (its ClaimInfoStateList: ClaimUID,
    ClaimName, Namespace, PodUIDs, DriverState), [] when there is none. The file is
    {"Data": "<JSON>", "Checksum": N}, the same at 1.33, 1.34 and 1.37."""
    try:
        outer = json.loads((state_dir / CHECKPOINT).read_text())
    except FileNotFoundError:
        return []
    claims: list[dict[str, Any]] = json.loads(outer["Data"]).get("ClaimInfoStateList") or []
    return claims

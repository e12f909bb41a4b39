"""One running device-manager harness: the kubelet's real ManagerImpl of one release.

The harness (judges/harness, Go) reads one JSON request per line on stdin and answers one JSON
reply per line on stdout; its klog output goes to a log file that a failure quotes. The
manager only uses /var/lib/kubelet/device-plugins, so the process runs in a private mount
namespace with the cell's directory bound there (plugin_process.in_namespace): devshim and
plugins outside the namespace meet it through the same socket inodes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shim.compat.plugin_process import in_namespace
from shim.compat.results import Failed

from .judge_process import JudgePod, JudgeProcess, running_judge
from .releases import Release

CHECKPOINT = "kubelet_internal_checkpoint"
# The machine the manager is told it runs on (cadvisor's topology): NUMA nodes 0-3, enough for
# the test drivers' devices; topology hints are made over these.
NUMA_NODES = 4


class HarnessError(Failed):
    """The real manager refused a request (its error text) or the harness itself failed."""


@dataclass(frozen=True)
class Container:
    name: str
    requests: Mapping[str, int] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "requests": dict(self.requests)}


@dataclass(frozen=True)
class Pod(JudgePod):
    """What the device manager reads of a pod: its containers' requests."""

    uid: str
    name: str
    containers: Sequence[Container]
    namespace: str = "default"
    init_containers: Sequence[Container] = ()


@dataclass(frozen=True)
class Capacity:
    capacity: Mapping[str, int]
    allocatable: Mapping[str, int]
    # The resources this call removed (stopped longer than the manager's 5-minute grace);
    # each is reported by one call only, and absent from the counts from then on.
    removed: Sequence[str]


class Harness(JudgeProcess):
    """Requests to one device-manager harness process (judges/harness)."""

    error = HarnessError

    async def start(
        self,
        pods: Sequence[Pod] = (),
        running: Sequence[str] = (),
        watcher_dir: Path | None = None,
        numa_nodes: int = NUMA_NODES,
        pod_resources_socket: Path | None = None,
    ) -> None:
        """NewManagerImpl and Start, with the pods and running containers ("uid/name") a
        restarted kubelet would pass, on a machine of `numa_nodes` NUMA nodes; with
        `watcher_dir`, the plugin manager watches it too; with `pod_resources_socket`, the
        kubelet's PodResources v1 server answers there."""
        await self.call(
            "start",
            pods=[p.wire() for p in pods],
            running=list(running),
            watcher_dir=str(watcher_dir) if watcher_dir else "",
            numa_nodes=numa_nodes,
            pod_resources_socket=str(pod_resources_socket) if pod_resources_socket else "",
        )

    async def capacity(self) -> Capacity:
        got = await self.call("capacity")
        return Capacity(got["capacity"], got["allocatable"], got["removed"])

    async def allocatable(self) -> dict[str, list[dict[str, Any]]]:
        """GetAllocatableDevices: the healthy devices per resource, {id, health, numa}."""
        result: dict[str, list[dict[str, Any]]] = await self.call("allocatable")
        return result

    async def admit(self, pod: Pod) -> dict[str, dict[str, list[str]]]:
        """Allocate for every container as admission does; the devices each got, per resource."""
        result: dict[str, dict[str, list[str]]] = await self.call("admit", pod=pod.wire())
        return result

    async def run_options(self, pod_uid: str, container: str) -> dict[str, Any]:
        """GetDeviceRunContainerOptions (PreStartContainer included): what the runtime gets."""
        result: dict[str, Any] = await self.call("run_options", pod_uid=pod_uid, container=container)
        return result

    async def assigned(self, pod_uid: str, container: str) -> dict[str, list[dict[str, Any]]]:
        result: dict[str, list[dict[str, Any]]] = await self.call(
            "assigned", pod_uid=pod_uid, container=container
        )
        return result

    async def hints(self, pod_uid: str, container: str) -> dict[str, list[dict[str, Any]]]:
        result: dict[str, list[dict[str, Any]]] = await self.call(
            "hints", pod_uid=pod_uid, container=container
        )
        return result

    async def remove_pod(self, uid: str) -> None:
        """The pod is no longer active (it ended): its devices are free at the next update."""
        await self.call("remove_pod", pod_uid=uid)


@asynccontextmanager
async def running_harness(
    release: Release, binary: Path, plugin_dir: Path, log: Path
) -> AsyncIterator[Harness]:
    """A harness process of `release` whose /var/lib/kubelet/device-plugins is `plugin_dir`;
    stopped (Stop, then its process group ended) on the way out."""
    async with (
        in_namespace(plugin_dir, [str(binary)]) as argv,
        running_judge(Harness, release, argv, log) as harness,
    ):
        yield harness


def checkpoint(plugin_dir: Path) -> dict[str, Any]:
    """The manager's checkpoint file in `plugin_dir`, parsed ({} when there is none)."""
    try:
        data: dict[str, Any] = json.loads((plugin_dir / CHECKPOINT).read_text())
    except FileNotFoundError:
        return {}
    return data

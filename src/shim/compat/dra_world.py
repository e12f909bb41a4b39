"""One DRA judge cell's world: devshim as a real process (`devshim run`) serving a driver's
resources as a DRA driver's pool, a release's real DRA manager as the kubelet
(shim.compat.upstream.dra_manager), and a real API server between them (shim.compat.realnode).

The test acts as the scheduler: it reads the published pool (`Published`) and writes a claim's
allocation and reservation (`allocate_claim`). The world of `devshim compat --dra` (issue 30)
and of devshim's own DRA judge tests (tests/compat/test_dra_judge.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shim.compat.realnode import ControlPlane
from shim.compat.realnode.node import free_port
from shim.compat.results import Failed
from shim.compat.tails import log_tail
from shim.compat.upstream.dra_manager import (
    Container,
    ContainerClaim,
    DraManager,
    DraManagerError,
    Pod,
    PodClaim,
    running_dra_manager,
)
from shim.compat.upstream.releases import Release
from shim.status import StatusUnavailable, fetch_status

DEVSHIM = [sys.executable, "-m", "shim"]
STOP_S = 20.0  # a devshim that ignores SIGTERM this long is killed
LOG_TAIL = 6000


class Published:
    """A devshim's slices as the API server holds them, read in one resource.k8s.io version."""

    def __init__(self, plane: ControlPlane, version: str, node: str, driver: str) -> None:
        self.plane, self.version, self.node, self.driver = plane, version, node, driver

    @classmethod
    def newest(cls, plane: ControlPlane, node: str, driver: str) -> Published:
        """Read in the newest resource.k8s.io version the server serves, as a scheduler would."""
        return cls(plane, plane.served_versions("resource.k8s.io")[0], node, driver)

    def slices(self) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={self.node},spec.driver={self.driver}"
        found = self.plane.request(
            "GET", f"/apis/resource.k8s.io/{self.version}/resourceslices?fieldSelector={selector}"
        )
        return list(found.get("items") or [])

    def pool(self) -> dict[str, dict[str, Any]] | None:
        """The devices of the pool's newest generation by name, or None while that generation is
        incomplete (fewer slices than resourceSliceCount), as a scheduler reads a pool."""
        items = self.slices()
        if not items:
            return None
        newest = max(s["spec"]["pool"]["generation"] for s in items)
        current = [s for s in items if s["spec"]["pool"]["generation"] == newest]
        if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
            return None
        return {d["name"]: d for s in current for d in s["spec"].get("devices") or []}

    async def until(
        self, holds: Callable[[dict[str, dict[str, Any]]], bool], what: str, timeout: float = 60
    ) -> dict[str, dict[str, Any]]:
        """The pool once ``holds(pool)``; Failed naming ``what`` (and the pool) after ``timeout``."""
        last: dict[str, dict[str, Any]] | None = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    last = await asyncio.to_thread(self.pool)
                    if last is not None and holds(last):
                        return last
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise Failed(f"timed out waiting until {what}; the pool was {json.dumps(last)[:2000]}") from None


def allocate_claim(
    plane: ControlPlane,
    version: str,
    name: str,
    results: list[tuple[str, str]],
    *,
    node: str,
    driver: str,
    pods: list[tuple[str, str]] | None = None,
    namespace: str = "default",
    admin: bool = False,
    shared: dict[str, Any] | None = None,
    binding: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ResourceClaim allocated and reserved as the scheduler leaves it: ``results`` are
    (request, device) pairs from ``driver``'s pool on ``node``, ``pods`` (name, uid) pairs
    reserve it (default: one pod named after the claim); ``admin``: every request asks for admin
    access (the namespace must carry resource.kubernetes.io/admin-access); ``shared``: what every
    result says of its share (shareID, consumedCapacity); ``binding``: what every result copies of
    its device's binding (bindingConditions, bindingFailureConditions), the allocation stamped
    with its time as the scheduler does. Returns the claim as stored."""
    counts = {request: sum(r == request for r, _ in results) for request, _ in results}
    extra = {"adminAccess": True} if admin else {}
    spec: list[dict[str, Any]]
    if version != "v1beta1":  # v1beta2 and v1 nest an exact request under "exactly"
        spec = [
            {"name": r, "exactly": {"deviceClassName": driver, "count": n, **extra}}
            for r, n in counts.items()
        ]
    else:
        spec = [{"name": r, "deviceClassName": driver, "count": n, **extra} for r, n in counts.items()]
    body = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": spec}},
    }
    path = f"/apis/resource.k8s.io/{version}/namespaces/{namespace}/resourceclaims"
    claim = plane.request("POST", path, body)
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": r,
                        "driver": driver,
                        "pool": node,
                        "device": d,
                        **extra,
                        **(shared or {}),
                        **(binding or {}),
                    }
                    for r, d in results
                ]  # fmt: skip
            },
            **(_bound_to(node) if binding else {}),
        },
        "reservedFor": [
            {"resource": "pods", "name": pod, "uid": uid}
            for pod, uid in (pods if pods is not None else [(f"{name}-pod", f"{name}-pod-uid")])
        ],
    }
    updated: dict[str, Any] = plane.request("PUT", f"{path}/{name}/status", claim)
    return updated


def _bound_to(node: str) -> dict[str, Any]:
    """What the scheduler adds to an allocation with binding conditions: its time, and the node
    (the API server lets only a service account on that node write the devices' conditions)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "allocationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "nodeSelector": {"nodeSelectorTerms": [term]},
    }


def claim_pod(claim: str) -> Pod:
    """A new pod whose one container ``c0`` uses the ResourceClaim named ``claim`` (by its own
    name, as 1.34's manager needs to find the claim's health)."""
    return Pod(
        uid=str(uuid.uuid4()),
        name=f"pod-{claim}",
        resource_claims=[PodClaim(claim, resource_claim_name=claim)],
        containers=[Container("c0", [ContainerClaim(claim)])],
    )


async def unprepare_retrying(manager: DraManager, pod_uid: str, timeout: float = 30) -> None:
    """As the kubelet retries an unprepare that fails while a restarted plugin is not up yet."""
    last = ""
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await manager.unprepare(pod_uid)
                    return
                except DraManagerError as refused:
                    last = str(refused)
                    await asyncio.sleep(0.1)
    except TimeoutError:
        raise Failed(f"unprepare kept failing for {timeout:g} s: {last}") from None


@dataclass
class RunningDevshim:
    proc: asyncio.subprocess.Process
    port: int
    log: Path

    def log_tail(self) -> str:
        return log_tail(self.log, LOG_TAIL)

    async def status(
        self, holds: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60
    ) -> dict[str, Any]:
        """devshim's /status once ``holds`` it: a condition, as /status is a snapshot up to 0.2 s
        old; Failed naming ``what`` and the last status after ``timeout``."""
        last: Any = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        last = await asyncio.to_thread(fetch_status, "127.0.0.1", self.port)
                        if holds(last):
                            return dict(last)
                    except (StatusUnavailable, KeyError, TypeError):
                        pass  # not serving yet, or not that far
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise Failed(f"timed out waiting until {what}; devshim's /status was {last}") from None

    async def kill(self) -> None:
        """SIGKILL, as an OOM kill or a node's crash would end it: nothing is cleaned up."""
        if self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        await self.proc.wait()


@asynccontextmanager
async def running_devshim(config_file: Path) -> AsyncIterator[RunningDevshim]:
    """`devshim run --config FILE` for the block, its ops endpoint on a free local port and its
    log in devshim.log beside the config; stopped with SIGTERM after (killed past STOP_S)."""
    port = free_port()
    log = config_file.parent / "devshim.log"
    env = {**os.environ, "DEVSHIM_HTTP__PORT": str(port), "DEVSHIM_HTTP__HOST": "127.0.0.1"}
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *DEVSHIM, "run", "--config", str(config_file), env=env, stdout=out, stderr=out
        )
    try:
        yield RunningDevshim(proc, port, log)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(STOP_S):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


@dataclass
class DraNode:
    """devshim and a release's DRA manager on one node, sharing its folders: the registry the
    manager's plugin watcher reads, the CDI specs it resolves, devshim's state."""

    plane: ControlPlane
    folder: Path
    node: str
    driver: str  # the DRA driver devshim serves
    manager: DraManager
    devshim: RunningDevshim

    async def kubelet_status(self, holds: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """devshim's /status once its DRA driver's kubelet side (``status["dra"][driver]
        ["kubelet"]``) ``holds``."""
        return await self.devshim.status(lambda s: holds(s["dra"][self.driver]["kubelet"]), what)

    async def registered(self) -> dict[str, Any]:
        return await self.kubelet_status(lambda k: k["registered"] is True, "the kubelet registered devshim")


@asynccontextmanager
async def dra_node(
    plane: ControlPlane,
    release: Release,
    binary: Path,
    folder: Path,
    config_file: Path,
    *,
    node: str,
    driver: str,
) -> AsyncIterator[DraNode]:
    """devshim run with ``config_file`` (its DRA plugin registering in ``folder``/registry, its
    CDI specs in ``folder``/cdi) and ``release``'s DRA manager started for ``node`` on them, the
    block entered once the manager registered devshim's ``driver``. Failed (with the logs' ends)
    if either does not come up; a Failed of the block gets devshim's log's end."""
    for sub in ("manager-state", "registry", "cdi"):
        (folder / sub).mkdir(exist_ok=True)
    log = folder / "dramanager.log"
    async with running_devshim(config_file) as devshim, running_dra_manager(release, binary, log) as manager:
        try:
            await manager.start(
                plane.admin_kubeconfig, node, folder / "manager-state", folder / "registry", [folder / "cdi"]
            )
            world = DraNode(plane, folder, node, driver, manager, devshim)
            await manager.registered(driver)
            await world.registered()
        except Failed as failed:
            tail = log_tail(log, LOG_TAIL)
            raise Failed(
                f"{failed}\n--- devshim's log, the end:\n{devshim.log_tail()}\n--- the DRA manager's:\n{tail}"
            ) from None
        try:
            yield world
        except Failed as failed:  # a row's check: what devshim logged is what its author reads next
            raise Failed(f"{failed}\n--- devshim's log, the end:\n{world.devshim.log_tail()}") from None

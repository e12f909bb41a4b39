"""DRA in tests: a `devshim run` publishing to a real control plane, and reading what it published."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from shim.compat.node import ControlPlane
from tests.support.devshim_process import DEVSHIM, free_port, http_get

SIM = [sys.executable, "-m", "adapters.sim"]
GPU_DRIVER = "gpu.example.com"

# Four GPUs with attributes and capacity, one with an ID that is not a DNS label.
SIM_GPUS: dict[str, Any] = {
    "name": "example.com/gpu",
    "attributes": {"model": {"string": "SimGPU"}, "gpu.example.com/ecc": {"bool": True}},
    "capacity": {"memory": "16Gi"},
    "devices": [
        {"id": "gpu-0", "numa_nodes": [0], "attributes": {"cores": {"int": 108}}},
        {"id": "gpu-1", "numa_nodes": [0], "attributes": {"driverVersion": {"version": "550.54.15"}}},
        {"id": "gpu-2", "capacity": {"memory": "80Gi"}},
        {"id": "GPU_3"},
    ],
}


class Published:
    """A devshim's slices as the API server holds them, read in one resource.k8s.io version."""

    def __init__(self, plane: ControlPlane, version: str, node: str, driver: str = GPU_DRIVER) -> None:
        self.plane, self.version, self.node, self.driver = plane, version, node, driver

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
        """The pool once ``holds(pool)``; AssertionError naming ``what`` (and the pool) after ``timeout``."""
        last: dict[str, dict[str, Any]] | None = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    last = await asyncio.to_thread(self.pool)
                    if last is not None and holds(last):
                        return last
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(
                f"timed out waiting until {what}; the pool was {json.dumps(last)[:2000]}"
            ) from None


def config(
    folder: Path,
    plane: ControlPlane,
    node: str,
    sim: dict[str, Any] | None = None,
    *,
    kubeconfig: Path | None = None,
    driver: dict[str, Any] | None = None,
    resources: list[str] | None = None,
) -> Path:
    """A devshim config whose driver is the sim serving ``sim`` (its control file in ``folder``)
    or ``driver``, and whose ``resources`` (default: the sim's) make up one DRA driver's pool."""
    if driver is None:
        assert sim is not None
        sim_config = {"resources": [sim], "control_file": str(folder / "sim.ctl")}
        (folder / "sim.ctl").write_text("")
        (folder / "sim.yaml").write_text(yaml.safe_dump(sim_config))
        driver = {"name": "sim", "command": [*SIM, "--config", str(folder / "sim.yaml")]}
        resources = resources or [sim["name"]]
    settings = {
        "device_plugins_dir": str(folder / "dp"),
        "plugins_registry_dir": str(folder / "registry"),
        "state_dir": str(folder / "state"),
        "drivers": [driver],
        "dra": {
            "plugins_dir": str(folder / "plugins"),
            "cdi_dir": str(folder / "cdi"),
            "node_name": node,
            "kubeconfig": str(kubeconfig or plane.admin_kubeconfig),
            "drivers": [{"name": GPU_DRIVER, "resources": resources}],
        },
    }
    path = folder / "devshim.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


@asynccontextmanager
async def running_devshim(config_file: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """`devshim run --config FILE` for the block (its ops port given), stopped with SIGTERM after;
    its log goes to devshim.log beside the config, whose tail a failing test shows."""
    port = free_port()
    log = config_file.parent / "devshim.log"
    env = {**os.environ, "DEVSHIM_HTTP__PORT": str(port), "DEVSHIM_HTTP__HOST": "127.0.0.1"}
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *DEVSHIM, "run", "--config", str(config_file), env=env, stdout=out, stderr=out
        )
    try:
        yield proc, port
    except BaseException:
        sys.stderr.write(f"--- devshim's log ({log}), the end:\n{log.read_text(errors='replace')[-6000:]}\n")
        raise
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(20):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def dra_status(
    port: int, holds: Callable[[dict[str, Any]], bool], what: str, timeout: float = 60
) -> dict[str, Any]:
    """devshim's /status "dra" section once ``holds`` it."""
    last: Any = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    code, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/status")
                except OSError:
                    code, body = 0, ""
                if code == 200:
                    last = json.loads(body).get("dra")
                    if isinstance(last, dict) and holds(last):
                        return last
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}; dra status was {last}") from None


async def control(folder: Path, line: str) -> None:
    """One command to the sim (adapters/sim/control.py)."""
    with (folder / "sim.ctl").open("a") as f:
        f.write(line + "\n")


def make_claim(
    plane: ControlPlane,
    version: str,
    name: str,
    results: list[tuple[str, str]],
    *,
    node: str,
    driver: str = GPU_DRIVER,
    pods: list[tuple[str, str]] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A ResourceClaim allocated and reserved as the scheduler leaves it: ``results`` are
    (request, device) pairs from ``driver``'s pool on ``node``, ``pods`` (name, uid) pairs
    reserve it (default: one pod named after the claim). Returns the claim as stored."""
    counts = {request: sum(r == request for r, _ in results) for request, _ in results}
    spec: list[dict[str, Any]]
    if version == "v1":
        spec = [{"name": r, "exactly": {"deviceClassName": driver, "count": n}} for r, n in counts.items()]
    else:
        spec = [{"name": r, "deviceClassName": driver, "count": n} for r, n in counts.items()]
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
                "results": [{"request": r, "driver": driver, "pool": node, "device": d} for r, d in results]
            }
        },
        "reservedFor": [
            {"resource": "pods", "name": pod, "uid": uid}
            for pod, uid in (pods if pods is not None else [(f"{name}-pod", f"{name}-pod-uid")])
        ],
    }
    updated: dict[str, Any] = plane.request("PUT", f"{path}/{name}/status", claim)
    return updated

"""DRA in tests: a `devshim run` publishing to a real control plane, and reading what it published."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from shim.compat import dra_world as world
from shim.compat.realnode import ControlPlane
from tests.support.devshim_process import http_get

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


def sim_policy(grant: dict[str, Any]) -> dict[str, Any]:
    """The grant policy allowing exactly what a sim resource's ``grant`` holds: its env names,
    and its device nodes' and mounts' host paths (a device's ``{id}`` as ``*``)."""
    unknown = set(grant) - {"envs", "device_nodes", "mounts"}
    assert not unknown, f"declare {sorted(unknown)} in the test's own policy"
    policy: dict[str, Any] = {}
    if grant.get("envs"):
        policy["envs"] = sorted(grant["envs"])
    for setting in ("device_nodes", "mounts"):
        if grant.get(setting):
            policy[setting] = sorted({n["host_path"].replace("{id}", "*") for n in grant[setting]})
    return policy


class Published(world.Published):
    """The product's pool reader (shim.compat.dra_world), for GPU_DRIVER unless told."""

    def __init__(self, plane: ControlPlane, version: str, node: str, driver: str = GPU_DRIVER) -> None:
        super().__init__(plane, version, node, driver)


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
    """A devshim config whose driver is the sim serving ``sim`` (its control file in ``folder``),
    declared with what its grant holds, or ``driver``, and whose ``resources`` (default: the
    sim's) make up one DRA driver's pool and are what the driver is declared to serve (unless
    ``driver`` says)."""
    if driver is None:
        assert sim is not None
        sim_config = {"resources": [sim], "control_file": str(folder / "sim.ctl")}
        (folder / "sim.ctl").write_text("")
        (folder / "sim.yaml").write_text(yaml.safe_dump(sim_config))
        driver = {"name": "sim", "user": "root", "command": [*SIM, "--config", str(folder / "sim.yaml")]}
        policy = sim_policy(sim.get("grant", {}))
        if policy:
            driver["policy"] = policy
        resources = resources or [sim["name"]]
    driver = {"resources": resources, **driver}
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
async def running(config_file: Path) -> AsyncIterator[world.RunningDevshim]:
    """`devshim run --config FILE` for the block (shim.compat.dra_world); a failing test shows
    the end of its log (devshim.log beside the config)."""
    async with world.running_devshim(config_file) as devshim:
        try:
            yield devshim
        except BaseException:
            sys.stderr.write(f"--- devshim's log ({devshim.log}), the end:\n{devshim.log_tail()}\n")
            raise


@asynccontextmanager
async def running_devshim(config_file: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """`running`, as its process and ops port."""
    async with running(config_file) as devshim:
        yield devshim.proc, devshim.port


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
    admin: bool = False,
    shared: dict[str, Any] | None = None,
    binding: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """shim.compat.dra_world.allocate_claim, for GPU_DRIVER unless told."""
    return world.allocate_claim(
        plane, version, name, results, node=node, driver=driver, pods=pods, namespace=namespace, admin=admin,
        shared=shared, binding=binding,
    )  # fmt: skip

"""devshim's DRA plugin as the kubelet calls it, for the tests that dial it (test_dra_prepare.py,
test_dra_held_ownership.py): a `devshim run` in a folder, its /status polled for a condition,
NodePrepareResources over the wire, and the sim drivers of a pool's two resources."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from shim.compat.realnode import ControlPlane
from shim.generated.dra.v1 import api_pb2 as dra_v1
from shim.generated.drahealth.v1 import api_pb2 as health_v1
from tests.support.devshim_process import http_get
from tests.support.dra import SIM

GPU = "gpu.example.com"  # the DRA driver of these tests' pools
HONEST, HOSTILE = "example.com/gpu", "evil.example.com/gpu"  # a pool's two resources, the second hostile


@dataclass
class Devshim:
    folder: Path
    config: Path
    port: int
    proc: Any

    @property
    def socket(self) -> Path:
        return self.folder / "plugins" / GPU / "dra.sock"

    def registration(self, driver: str = GPU) -> Path:
        return self.folder / "registry" / f"{driver}-reg.sock"

    def channel(self, driver: str = GPU) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"unix:{self.folder / 'plugins' / driver / 'dra.sock'}")

    async def calls(self, after: dict[str, int], driver: str = GPU) -> dict[str, int]:
        """Every devshim driver's call tallies (``{"sim allocate": 1, ...}``) in the first /status
        whose DRA driver ``driver`` has answered the kubelet as ``after`` counts (its calls, e.g.
        ``{"NodePrepareResources ok": 2}``): what the drivers were asked for those calls (/status
        is a snapshot up to 0.2 s old, so a condition, not the next read, says it is current)."""
        status = await status_when(
            self.port,
            lambda s: all(s["dra"][driver]["kubelet"]["calls"].get(k, 0) == n for k, n in after.items()),
        )
        return {
            f"{name} {method}": tally["ok"]
            for name, d in status["drivers"].items()
            for method, tally in d["calls"].items()
            if method != "list_devices"
        }


async def status_when(
    port: int, holds: Callable[[dict[str, Any]], bool], timeout: float = 60
) -> dict[str, Any]:
    last: Any = None
    async with asyncio.timeout(timeout):
        while True:
            code, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/status")
            if code == 200 and holds(last := json.loads(body)):
                return dict(last)
            await asyncio.sleep(0.05)


async def _call(shim: Devshim, method: str, claims: list[dict[str, Any]], pb: Any, driver: str) -> Any:
    """``method`` of ``pb``'s DRAPlugin for ``claims`` (as the API server stored them), its answer."""
    refs = [
        pb.Claim(namespace=c["metadata"]["namespace"], name=c["metadata"]["name"], uid=c["metadata"]["uid"])
        for c in claims
    ]
    request = getattr(pb, f"{method}Request")(claims=refs)
    async with shim.channel(driver) as channel:
        service = pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
        raw = await channel.unary_unary(f"/{service}/{method}", None, None)(
            request.SerializeToString(), timeout=60
        )
    return getattr(pb, f"{method}Response").FromString(raw)


async def prepare(
    shim: Devshim, claims: list[dict[str, Any]], pb: Any = dra_v1, driver: str = GPU
) -> dict[str, Any]:
    """NodePrepareResources for ``claims`` in ``pb``'s version: each claim's answer by uid."""
    return dict((await _call(shim, "NodePrepareResources", claims, pb, driver)).claims)


async def unprepare(
    shim: Devshim, claims: list[dict[str, Any]], pb: Any = dra_v1, driver: str = GPU
) -> dict[str, str]:
    """NodeUnprepareResources for ``claims``: each claim's error by uid ("" when it succeeded)."""
    answer = await _call(shim, "NodeUnprepareResources", claims, pb, driver)
    return {uid: claim.error for uid, claim in answer.claims.items()}


async def watch_health(shim: Devshim, heard: dict[str, str], driver: str = GPU) -> None:
    """As the kubelet (1.36+) does: keep a v1 NodeWatchResources stream open, open another when
    one ends, and keep in ``heard`` each device's health ("HEALTHY", ...) as the last report
    gave it. Runs until cancelled."""
    service = health_v1.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name
    request = health_v1.NodeWatchResourcesRequest().SerializeToString()
    while True:
        try:
            async with shim.channel(driver) as channel:
                async for raw in channel.unary_stream(f"/{service}/NodeWatchResources", None, None)(request):
                    message = health_v1.NodeWatchResourcesResponse.FromString(raw)
                    heard.clear()
                    heard.update(
                        {d.device.device_name: health_v1.HealthStatus.Name(d.health) for d in message.devices}
                    )
        except grpc.aio.AioRpcError:
            pass  # devshim away (restarting): the kubelet tries again
        await asyncio.sleep(0.2)


def pool_config(
    folder: Path,
    plane: ControlPlane,
    node: str,
    drivers: list[dict[str, Any]],
    pools: list[dict[str, Any]] | None = None,
) -> Path:
    """devshim's settings in ``folder``: ``drivers``, and the DRA drivers ``pools`` (by default
    GPU's one pool [HONEST, HOSTILE]) on ``node``, published through ``plane``."""
    settings = {
        "device_plugins_dir": str(folder / "dp"),
        "plugins_registry_dir": str(folder / "registry"),
        "state_dir": str(folder / "state"),
        "drivers": drivers,
        "dra": {
            "node_name": node,
            "kubeconfig": str(plane.admin_kubeconfig),
            "plugins_dir": str(folder / "plugins"),
            "cdi_dir": str(folder / "cdi"),
            "drivers": pools or [{"name": GPU, "resources": [HONEST, HOSTILE]}],
        },
    }
    path = folder / "devshim.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def spec_of(shim: Devshim, driver: str, uid: str) -> Path:
    return shim.folder / "cdi" / f"devshim-{driver}-{uid}.json"


def sim_driver(folder: Path, name: str, resource: dict[str, Any]) -> dict[str, Any]:
    """A sim driver serving ``resource``, declared with it and its grant's SIM_DEVICES; its
    control file is ``<folder>/<name>/sim.ctl``."""
    home = folder / name
    home.mkdir()
    (home / "sim.ctl").write_text("")
    (home / "sim.yaml").write_text(
        yaml.safe_dump({"resources": [resource], "control_file": str(home / "sim.ctl")})
    )
    return {
        "name": name,
        "user": "root",
        "command": [*SIM, "--config", str(home / "sim.yaml")],
        "resources": [resource["name"]],
        "policy": {"envs": ["SIM_DEVICES"]},
    }


def models(pool: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each published device's model attribute (on the device in v1 and v1beta2)."""
    return {name: d["attributes"]["model"]["string"] for name, d in pool.items()}


def granted_env(shim: Devshim, uid: str) -> list[str]:
    """The env of a claim's CDI spec: the grant its devices were prepared with."""
    spec = json.loads(spec_of(shim, GPU, uid).read_text())
    return [e for device in spec["devices"] for e in device["containerEdits"].get("env", [])]

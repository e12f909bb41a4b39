"""Row dra: a driver's change among 10,000 devices -> the pool's ResourceSlices updated.

A real kube-apiserver and etcd (release 1.37, shim.compat.realnode.ControlPlane; built on first use,
minutes) and `devshim run` with the sim serving 10,000 devices with attributes and capacity, in
one DRA driver's pool: 79 slices. Measured:

- the first publish: devshim's start -> the whole pool written (its /status), and the writes;
- a change: one device hot-plugged (a line appended to the sim's control file, which the sim
  polls every 50 ms) -> devshim's /status says the new generation is written. A change rewrites
  every slice (all of a pool's slices carry its generation), so the baseline is that floor: the
  same 79 slices PUT one after another by this process over one connection (urllib), A/B
  alternating with devshim's changes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from bench.common import ROOT, Result, free_port, number, ratio, stats_ms, workdir
from shim.compat.realnode import ControlPlane

DEVICES = 10_000
DRIVER = "gpu.example.com"
NODE = "bench-node"


async def dra_publish(quick: bool) -> Result:
    changes = 5 if quick else 20
    with workdir() as folder, ControlPlane(37, folder / "cp") as plane:
        port = free_port()
        config = _config(folder, plane)
        env = {"DEVSHIM_HTTP__PORT": str(port), "DEVSHIM_HTTP__HOST": "127.0.0.1"}
        began = time.monotonic()
        with (folder / "devshim.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "shim", "run", "--config", str(config), "--log-level", "WARNING",
                cwd=ROOT, env={**os.environ, **env}, stderr=log,
            )  # fmt: skip
        try:
            first = await _status(port, lambda s: s["devices"] == DEVICES, 300)
            first_s = time.monotonic() - began
            ours: list[float] = []
            floor: list[float] = []
            for n in range(changes):
                generation = (await _status(port, lambda s: True, 30))["generation"]
                sent = time.monotonic()
                with (folder / "sim.ctl").open("a") as ctl:
                    ctl.write(f"count example.com/gpu {DEVICES + n + 1}\n")
                await _status(port, lambda s, g=generation: s["generation"] > g, 60)
                ours.append(time.monotonic() - sent)
                floor.append(await asyncio.to_thread(_rewrite, plane, _slices(plane)))
            last = await _status(port, lambda s: True, 30)
        finally:
            proc.terminate()
            await proc.wait()
    mine, bare = stats_ms(ours), stats_ms(floor)
    return Result(
        "dra: a change among 10k devices -> slices updated",
        bare,
        mine,
        f"{number(ratio(mine['p50_ms'], bare['p50_ms']))}x p50, "
        f"{number(ratio(mine['p99_ms'], bare['p99_ms']))}x p99",
        "reported",
        None,
        note=(
            f"first publish of {DEVICES} devices in {first['slices']} slices: {first_s:.1f} s from "
            f"devshim's start (driver start included), {first['writes']} writes; after {changes} "
            f"changes {last['writes']} writes in all. Baseline: the same slices PUT by this process."
        ),
        extra={"first_publish_s": round(first_s, 2), "slices": first["slices"]},
    )


def _config(folder: Path, plane: ControlPlane) -> Path:
    sim = {
        "resources": [
            {
                "name": "example.com/gpu",
                "count": DEVICES,
                "attributes": {"model": {"string": "SimGPU"}, "ecc": {"bool": True}},
                "capacity": {"memory": "16Gi"},
            }
        ],
        "control_file": str(folder / "sim.ctl"),
    }
    (folder / "sim.ctl").write_text("")
    (folder / "sim.yaml").write_text(yaml.safe_dump(sim))
    settings: dict[str, Any] = {
        "device_plugins_dir": str(folder / "dp"),
        "state_dir": str(folder / "state"),
        "deallocation": {"enabled": False},
        "drivers": [
            {
                "name": "sim",
                "user": "root",
                "command": [
                    sys.executable,
                    "-m",
                    "devshim_adapters.sim",
                    "--config",
                    str(folder / "sim.yaml"),
                ],
            }
        ],
        "dra": {
            "node_name": NODE,
            "kubeconfig": str(plane.admin_kubeconfig),
            "drivers": [{"name": DRIVER, "resources": ["example.com/gpu"]}],
        },
    }
    path = folder / "devshim.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


async def _status(port: int, holds: Any, timeout: float) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            try:
                body = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/status")
                status = json.loads(body)["dra"][DRIVER]
                if holds(status):
                    return dict(status)
            except (OSError, KeyError, TypeError, ValueError):
                pass
            await asyncio.sleep(0.005)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _slices(plane: ControlPlane) -> list[dict[str, Any]]:
    found = plane.request(
        "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={NODE}"
    )
    return list(found["items"])


def _rewrite(plane: ControlPlane, items: list[dict[str, Any]]) -> float:
    """The floor: every slice PUT back as it is (each a full write of 128 devices)."""
    began = time.monotonic()
    for item in items:
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **item}
        plane.request("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{item['metadata']['name']}", body)
    return time.monotonic() - began

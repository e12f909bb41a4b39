"""Row podstart: a pod's start on the real node, its device from the native Go plugin or through
devshim, alternating.

The real node of shim.compat.realnode (the upstream kubelet 1.37, containerd and runc) runs
static pods of one busybox container asking for one device each, from four plugins registered
with the same kubelet at once:

- native: goplug (tests/support/legacy_plugins/go), a vendor-style Go plugin on k8s.io/kubelet;
- static: devshim answering from a static resource;
- sim: devshim asking the sim driver per Allocate (one JSON-RPC round trip);
- legacy: devshim's legacy adapter in front of a second goplug (two hops).

Each round starts one pod per arm, in turn, and times it from its manifest written into the
kubelet's static-pod folder to the kubelet reporting it Running (polled every POLL_S), then
removes it and waits until the kubelet has forgotten it, so one pod runs at a time. Every arm's
grant is goplug's (an env, /dev/null as a device node, a CDI name the runtime does not resolve
here: so the CDI name is left out), so the containers are alike. Goal (issue 47): devshim's pod
start at p50 within 1.05x of the native plugin's. Needs root, containerd, runc and Go.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import Result, declared_by, free_port, number, percentile, ratio, sim_driver, workdir
from bench.goview import GOPLUG, go_build
from shim.compat.realnode import Node, NodeUnavailable, pod_manifest
from shim.compat.upstream import releases as upstream

ARMS = {
    "native": "example.com/goplug",
    "static": "example.com/pod-static",
    "sim": "example.com/pod-sim",
    "legacy": "example.com/pod-legacy",
}
GOAL = 1.05  # devshim's p50 over native's, each devshim arm
POLL_S = 0.02
GRANT = {  # goplug's grant less its CDI name (containerd here resolves no goplug spec)
    "envs": {"GOPLUG_DEVICES": "{ids}"},
    "device_nodes": [{"container_path": "/dev/goplug/{id}", "host_path": "/dev/null", "permissions": "rw"}],
}


def _config(node: Node, folder: Path, goplug: Path) -> dict[str, Any]:
    private = folder / "legacy"
    private.mkdir()
    legacy = [sys.executable, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private), "--",
              str(goplug), "-dir", str(private), "-resource", ARMS["legacy"]]  # fmt: skip
    sim = {"name": ARMS["sim"], "grant_mode": "per_call", "count": 3, "id_prefix": "g", "grant": GRANT}
    policy = {**declared_by([GRANT]), "cdi_kinds": [ARMS["native"]]}  # goplug's CDI kind, whatever -resource
    return {
        "device_plugins_dir": str(node.device_plugins_dir),
        "plugins_registry_dir": str(node.plugins_registry_dir),
        "state_dir": str(folder / "state"),
        "deallocation": {"pod_resources_socket": str(node.pod_resources_socket)},
        "log_level": "WARNING",
        "resources": [{"name": ARMS["static"], "static": {"count": 3, "id_prefix": "g", "grant": GRANT}}],
        "drivers": [
            {"name": "sim", **sim_driver(folder, [sim])},
            {
                "name": "legacy",
                "user": "root",
                "command": legacy,
                "resources": [ARMS["legacy"]],
                "policy": policy,
            },
        ],
    }


def _phase(node: Node, name: str) -> str | None:
    pod = node.pods().get(name)
    return None if pod is None else str(pod.get("status", {}).get("phase"))


async def _start_once(node: Node, arm: str, n: int, timeout: float = 60.0) -> float | None:
    """Seconds from the manifest to Running, or None if the kubelet refused it (its devices not
    yet allocatable: start-up only); the pod is gone again when this returns."""
    name = f"{arm}-{n}"
    began = time.monotonic()
    node.run_pod(pod_manifest(name, "exec sleep 3600", {ARMS[arm]: 1}))
    took: float | None = None
    try:
        while time.monotonic() - began < timeout:
            phase = await asyncio.to_thread(_phase, node, name)
            if phase == "Running":
                took = time.monotonic() - began
                break
            if phase == "Failed":
                break
            await asyncio.sleep(POLL_S)
        else:
            raise TimeoutError(f"pod {name} not Running within {timeout:g} s")
    finally:
        node.remove_pod(name)
        while await asyncio.to_thread(_phase, node, name) is not None:
            await asyncio.sleep(0.1)
    return took


async def podstart(quick: bool) -> Result:
    rounds = 5 if quick else 60
    if os.geteuid() != 0:
        return Result("podstart", {}, {}, "", "", None, note="needs root (the real node)")
    [release] = [r for r in upstream.releases() if r.minor == 37]
    kubelet = await asyncio.to_thread(upstream.build, release, program=upstream.KUBELET_PROGRAM, log=False)
    goplug = await asyncio.to_thread(go_build, GOPLUG, "goplug")
    samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with workdir() as folder:
        node = Node(folder / "node", kubelet, release.minor)
        try:
            await asyncio.to_thread(node.start)
        except NodeUnavailable as missing:
            return Result("podstart", {}, {}, "", "", None, note=f"no real node here: {missing}")
        native = devshim = None
        try:
            env = {**os.environ, "DP_DIR": str(node.device_plugins_dir)}
            with (folder / "goplug.log").open("ab") as log:
                native = subprocess.Popen([str(goplug)], env=env, stderr=log)
            config = folder / "devshim.json"
            config.write_text(json.dumps(_config(node, folder, goplug)))
            env = {**os.environ, "DEVSHIM_HTTP__PORT": str(free_port()), "DEVSHIM_HTTP__HOST": "127.0.0.1"}
            with (folder / "devshim.log").open("ab") as log:
                devshim = subprocess.Popen([sys.executable, "-m", "shim", "run", "--config", str(config)],
                                           env=env, stderr=log)  # fmt: skip
            for arm in ARMS:  # warm-up: each arm's first pod, once its devices are allocatable
                for attempt in range(100):
                    if await _start_once(node, arm, -attempt - 1) is not None:
                        break
                    await asyncio.sleep(0.5)
                else:
                    raise RuntimeError(f"{arm}: no pod ran in 100 tries ({folder / 'devshim.log'})")
            for n in range(rounds):
                order = list(ARMS) if n % 2 == 0 else list(reversed(ARMS))
                for arm in order:
                    took = await _start_once(node, arm, n)
                    if took is None:
                        raise RuntimeError(f"{arm}: pod {n} refused by the kubelet")
                    samples[arm].append(took)
        finally:
            for process in (native, devshim):
                if process is not None:
                    process.terminate()
                    process.wait(30)
            await asyncio.to_thread(node.stop)
    figures = {
        arm: {"p50_ms": round(statistics.median(s) * 1000, 1), "p99_ms": round(percentile(s, 99) * 1000, 1)}
        for arm, s in samples.items()
    }
    base = figures.pop("native")
    ratios = {arm: ratio(f["p50_ms"], base["p50_ms"]) for arm, f in figures.items()}
    worst = max(ratios.values())
    return Result(
        "podstart: manifest -> Running on the real node, devshim's arms beside the native Go plugin",
        base,
        {f"{arm}_{k}": v for arm, f in figures.items() for k, v in f.items()},
        ", ".join(f"{arm} {number(r)}x" for arm, r in ratios.items()) + " p50",
        f"each ≤ {GOAL}x native at p50",
        worst <= GOAL,
        by="" if worst <= GOAL else f"{worst - GOAL:.2f}x over",
        note=f"{rounds} pods per arm, alternating; kubelet 1.{release.minor}, containerd, runc",
        extra={"figures": figures, "native": base},
    )

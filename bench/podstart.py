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
import re
import statistics
import subprocess
import sys
import time
import urllib.request
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


DRA_ARMS = {"helper": "test-driver.cdi.k8s.io", "devshim": "gpu.example.com"}
# No controller-manager runs to deallocate a claim once its pod is gone: every claim keeps its
# device, so each driver publishes one per claim the row makes.
DRA_DEVICES = 100
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
_PREPARE = re.compile(
    r"^dra_grpc_operations_duration_seconds_(sum|count)\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.M
)


def _prepare_seconds(port: int) -> dict[str, tuple[float, float]]:
    """The kubelet's own NodePrepareResources timings so far, by DRA driver: (sum, count)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, list[float]] = {}
    for match in _PREPARE.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if labels.get("method_name", "").endswith("NodePrepareResources"):
            pair = found.setdefault(labels.get("driver_name", ""), [0.0, 0.0])
            pair[0 if match[1] == "sum" else 1] += float(match["value"])
    return {driver: (pair[0], pair[1]) for driver, pair in found.items()}


async def _claim_start(cluster: Any, arm: str, n: int, timeout: float = 60.0) -> float | None:
    """Seconds from the pod created (its claim made just before) to Running; None if it failed."""
    from shim.compat.realnode.connected import api_pod

    name = f"{arm}-{n}".replace("_", "-")
    claim = {"metadata": {"name": name}, "spec": {"devices": {"requests": [
        {"name": "d", "exactly": {"deviceClassName": DRA_ARMS[arm]}}]}}}  # fmt: skip
    cluster.request("POST", CLAIMS, claim)
    began = time.monotonic()
    cluster.create_pod(api_pod(name, "exec sleep 3600", claims={"d": name}))
    took = None
    try:
        while time.monotonic() - began < timeout:
            pod = await asyncio.to_thread(cluster.pod, name)
            if pod is not None and pod["status"].get("phase") == "Running":
                took = time.monotonic() - began
                break
            await asyncio.sleep(POLL_S)
    finally:
        cluster.delete_pod(name)
        while await asyncio.to_thread(cluster.pod, name) is not None:
            await asyncio.sleep(0.1)
        cluster.request("DELETE", f"{CLAIMS}/{name}")
    return took


async def podstart_dra(quick: bool) -> Result:
    """Row podstart_dra: a pod with a ResourceClaim on the connected node (API server, scheduler,
    kubelet, containerd with CDI), its device from upstream's own DRA test driver on the
    kubeletplugin helper (helper) or from devshim (a static resource, DRA only), alternating;
    manifest to Running, and the kubelet's own NodePrepareResources timings per driver (its
    dra_grpc_operations_duration_seconds: the mean, the kubelet keeps a histogram). Goals (issue
    47): pod start ≤ 1.05x the helper's at p50; NodePrepareResources ≤ 1.5x the helper's."""
    from shim.compat.realnode.connected import ConnectedNode, connected_releases
    from shim.compat.realnode.kubelet import NODE_NAME

    rounds = 5 if quick else 30  # under DRA_DEVICES with the warm-up's
    if os.geteuid() != 0 or not connected_releases():
        return Result(
            "podstart_dra", {}, {}, "", "", None, note="needs root and the connected node's programs"
        )
    [release] = [r for r in upstream.releases() if r.minor == 37]
    helper = await asyncio.to_thread(upstream.build_dra_test_driver, release, log=False)
    samples: dict[str, list[float]] = {arm: [] for arm in DRA_ARMS}
    with workdir() as folder:
        cluster = ConnectedNode(release.minor, folder / "cluster")
        try:
            await asyncio.to_thread(cluster.start)
        except NodeUnavailable as missing:
            return Result("podstart_dra", {}, {}, "", "", None, note=f"no connected node here: {missing}")
        node, processes = cluster.node, []
        try:
            (node.plugins_dir / DRA_ARMS["helper"]).mkdir(parents=True, exist_ok=True)
            argv = [str(helper), "--drivername", DRA_ARMS["helper"], "kubelet-plugin",
                    "--plugin-registration-path", str(node.plugins_registry_dir),
                    "--datadir", str(node.plugins_dir), "--cdi-dir", str(node.cdi_dir),
                    "--node-name", NODE_NAME, "--num-devices", str(DRA_DEVICES)]  # fmt: skip
            env = {**os.environ, "KUBECONFIG": str(cluster.plane.admin_kubeconfig)}
            with (folder / "helper.log").open("ab") as log:
                processes.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log))
            static = {"count": DRA_DEVICES, "grant": {"envs": {"GPU": "{ids}"}}}
            pool = {
                "name": DRA_ARMS["devshim"],
                "resources": ["example.com/dra-static"],
                "device_plugin": False,
            }
            settings = {
                "device_plugins_dir": str(node.device_plugins_dir),
                "plugins_registry_dir": str(node.plugins_registry_dir),
                "state_dir": str(folder / "state"),
                "log_level": "WARNING",
                "resources": [{"name": "example.com/dra-static", "static": static}],
                "dra": {"plugins_dir": str(node.plugins_dir), "cdi_dir": str(node.cdi_dir),
                        "node_name": NODE_NAME, "kubeconfig": str(cluster.plane.admin_kubeconfig),
                        "drivers": [pool]},
            }  # fmt: skip
            config = folder / "devshim.json"
            config.write_text(json.dumps(settings))
            env = {**os.environ, "DEVSHIM_HTTP__PORT": str(free_port()), "DEVSHIM_HTTP__HOST": "127.0.0.1"}
            with (folder / "devshim.log").open("ab") as log:
                command = [sys.executable, "-m", "shim", "run", "--config", str(config)]
                processes.append(subprocess.Popen(command, env=env, stderr=log))
            for driver in DRA_ARMS.values():
                selector = {"cel": {"expression": f'device.driver == "{driver}"'}}
                device_class = {"metadata": {"name": driver}, "spec": {"selectors": [selector]}}
                cluster.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class)
            for arm in DRA_ARMS:  # warm-up, once each driver is registered and published
                for attempt in range(60):
                    if await _claim_start(cluster, arm, -attempt - 1, timeout=10) is not None:
                        break
                else:
                    raise RuntimeError(f"{arm}: no claim's pod ran in 60 tries ({folder})")
            before = _prepare_seconds(node.read_only_port)
            for n in range(rounds):
                for arm in DRA_ARMS if n % 2 == 0 else reversed(DRA_ARMS):
                    took = await _claim_start(cluster, arm, n)
                    if took is None:
                        raise RuntimeError(f"{arm}: claim {n}'s pod did not run")
                    samples[arm].append(took)
            after = _prepare_seconds(node.read_only_port)
        finally:
            for process in processes:
                process.terminate()
                process.wait(30)
            await asyncio.to_thread(cluster.stop)
    prepare = {}
    for arm, driver in DRA_ARMS.items():
        (s0, c0), (s1, c1) = before.get(driver, (0.0, 0.0)), after.get(driver, (0.0, 0.0))
        prepare[arm] = round((s1 - s0) / (c1 - c0) * 1000, 2) if c1 > c0 else float("nan")
    figures = {
        arm: {"p50_ms": round(statistics.median(s) * 1000, 1), "p99_ms": round(percentile(s, 99) * 1000, 1),
              "prepare_mean_ms": prepare[arm]}
        for arm, s in samples.items()
    }  # fmt: skip
    base, mine = figures["helper"], figures["devshim"]
    start, prep = (
        ratio(mine["p50_ms"], base["p50_ms"]),
        ratio(mine["prepare_mean_ms"], base["prepare_mean_ms"]),
    )
    met = start <= GOAL and prep <= 1.5
    return Result(
        "podstart_dra: a claim's pod on the connected node, devshim beside upstream's Go DRA driver",
        base,
        mine,
        f"pod start {number(start)}x p50, NodePrepareResources {number(prep)}x (mean)",
        f"≤ {GOAL}x pod start at p50, ≤ 1.5x NodePrepareResources",
        met,
        note=f"{rounds} claims per driver, alternating; kubelet, API server and scheduler 1.{release.minor}",
        extra={"figures": figures},
    )

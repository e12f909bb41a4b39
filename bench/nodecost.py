"""Row nodecost: what each node pays for devshim while nothing happens, and with a health change a
second, beside the native Go plugin and the floor, all measured in the same run.

Each arm runs alone, registered with a fake kubelet of its own, settles, then is watched for
IDLE_S seconds doing nothing and CHANGE_S seconds with a device's health flipped every second
where it can be. Per arm: VmRSS of its processes; CPU seconds per hour (utime + stime); and
wake-ups per second, the times each thread was put on a CPU (/proc/PID/task/TID/schedstat's
third field), split into gRPC's own threads (its C core's timer, event-engine pool and lifeguard
threads, which any gRPC server has) and the process's own (the event loop, and a driver's). Arms:

- floor: a Python process with a grpc.aio server started on a unix socket and nothing else (the
  interpreter plus grpcio: the issue's memory floor, and the wake-ups every gRPC server pays);
- goplug: the vendor-style Go plugin (tests/support/legacy_plugins/go) on k8s.io/kubelet's API;
- static: `devshim run -r example.com/gpu=8`;
- driver: `devshim run` with bench/driver.py (an SDK driver; SIGUSR1 flips a device, which is
  the change a second), devshim and the driver apart;
- dra: devshim with the static resource in a DRA pool, publishing to a real kube-apiserver
  (1.37; built on first use) and serving the kubelet's DRA socket;
- go_dra: upstream's own DRA test driver (k8s.io/kubernetes test/e2e/dra/test-driver), a kubelet
  plugin on k8s.io/dynamic-resource-allocation's kubeletplugin helper, publishing as many devices
  to the same kind of API server (built from the judge's 1.37 module on first use).
Goals: devshim idle within 5 MB of the floor's RSS; with DRA no more than the Go helper; no
periodic wake-up of devshim's own more often than once a second while nothing changes (measured:
at most 1.1 a second, the rest being what the API server sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import yaml

from bench.common import (
    ROOT,
    TICK_S,
    Result,
    bench_driver,
    children,
    cpu_ticks,
    running,
    start_devshim,
    workdir,
    write_config,
)
from bench.goview import GOPLUG, go_build
from bench.memory import rss_mb
from shim.compat.fakekubelet import FakeKubelet

RESOURCE = "example.com/gpu"
SETTLE_S = 3.0  # after the first list: state written, start-up's timers done
MEMORY_GOAL_MB = 5.0  # over the floor
# Per second, idle: one periodic timer at 1 s at most (DRA's socket check, shim/dra/plugin/server.py),
# plus what the API server sends unasked (a watch's bookmarks): devshim's own loop, not gRPC's.
OWN_WAKEUPS_GOAL = 1.1
# gRPC's C core's threads (names as the kernel shows them, cut at 15 characters).
GRPC_THREADS = ("grpc_global_tim", "event_engine", "lifeguard", "default-executo", "resolver-execut")
FLOOR = (
    "import asyncio, sys, grpc\n"
    "async def main():\n"
    "    server = grpc.aio.server()\n"
    "    server.add_insecure_port('unix://' + sys.argv[1])\n"
    "    await server.start()\n"
    "    print('serving', flush=True)\n"
    "    await asyncio.Event().wait()\n"
    "asyncio.run(main())\n"
)
Flip = Callable[[], Awaitable[None]] | None


def _threads(pid: int) -> dict[str, int]:
    """Each thread's times on a CPU so far, by "name:tid"."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            comm = (task / "comm").read_text().strip()
            found[f"{comm}:{task.name}"] = int((task / "schedstat").read_text().split()[2])
    return found


async def _watch(pids: list[int], seconds: float, flip: Flip) -> dict[str, float]:
    """Wake-ups per second (the processes' own, and gRPC's threads') and CPU seconds per hour of
    ``pids`` over ``seconds``, ``flip`` called once a second if given."""
    before = {pid: _threads(pid) for pid in pids}
    ticks = sum(cpu_ticks(pid) for pid in pids)
    began = time.monotonic()
    while (left := seconds - (time.monotonic() - began)) > 0:
        if flip is not None:
            await flip()
        await asyncio.sleep(min(1.0, left))
    elapsed = time.monotonic() - began
    own = grpc = 0
    for pid in pids:
        for thread, count in _threads(pid).items():
            woke = count - before[pid].get(thread, 0)
            if thread.split(":")[0] in GRPC_THREADS:
                grpc += woke
            else:
                own += woke
    cpu_s = (sum(cpu_ticks(pid) for pid in pids) - ticks) * TICK_S
    return {
        "own_wakeups_per_s": round(own / elapsed, 2),
        "grpc_wakeups_per_s": round(grpc / elapsed, 2),
        "cpu_s_per_h": round(cpu_s * 3600 / elapsed, 1),
    }


async def _measure(pids: list[int], idle_s: float, change_s: float, flip: Flip) -> dict[str, float]:
    await asyncio.sleep(SETTLE_S)
    figures = {"rss_mb": round(sum(rss_mb(pid) for pid in pids), 1)}
    figures |= {f"idle_{k}": v for k, v in (await _watch(pids, idle_s, None)).items()}
    if flip is not None:
        figures |= {f"changing_{k}": v for k, v in (await _watch(pids, change_s, flip)).items()}
    return figures


async def floor(folder: Path, idle_s: float, change_s: float) -> dict[str, float]:
    socket = folder / "floor.sock"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FLOOR, str(socket), stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    async with running(proc):
        assert proc.stdout is not None
        await proc.stdout.readline()
        return await _measure([proc.pid], idle_s, change_s, None)


async def goplug(folder: Path, idle_s: float, change_s: float) -> dict[str, float]:
    binary = await asyncio.to_thread(go_build, GOPLUG, "goplug")
    async with FakeKubelet(folder / "native") as kubelet:
        env = {**os.environ, "DP_DIR": str(kubelet.plugin_dir)}
        with (folder / "goplug.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(str(binary), env=env, stderr=log)
        async with running(proc):
            session = await kubelet.wait_for_plugin("example.com/goplug", timeout=60)
            await session.wait_for_list(lambda d: len(d) == 3, timeout=60)
            return await _measure([proc.pid], idle_s, change_s, None)


async def static(folder: Path, idle_s: float, change_s: float) -> dict[str, float]:
    plugins = folder / "static"
    async with (
        FakeKubelet(plugins) as kubelet,
        running(await start_devshim(plugins, f"{RESOURCE}=8")) as proc,
    ):
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=60)
        await session.wait_for_list(lambda d: len(d) == 8, timeout=60)
        return await _measure([proc.pid], idle_s, change_s, None)


async def driver(folder: Path, idle_s: float, change_s: float) -> dict[str, float]:
    config = write_config(folder / "driver.yaml", {"bench": bench_driver(folder / "stamps", {RESOURCE: 8})})
    plugins = folder / "driver"
    async with FakeKubelet(plugins) as kubelet, running(await start_devshim(plugins, config=config)) as proc:
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=60)
        await session.wait_for_list(lambda d: len(d) == 8, timeout=60)
        (child,) = children(proc.pid)

        async def flip() -> None:
            os.kill(child, signal.SIGUSR1)

        both = await _measure([proc.pid, child], idle_s, change_s, flip)
        alone = await _watch([proc.pid], idle_s, None)
        both["devshim_rss_mb"] = rss_mb(proc.pid)
        return both | {f"devshim_idle_{k}": v for k, v in alone.items()}


async def dra(folder: Path, idle_s: float, change_s: float) -> dict[str, float]:
    """DRA only (device_plugin: false): the kubelet's side is its DRA socket, the API server's
    the published slices; both waited for before the watch."""
    from bench.dra import NODE
    from shim.compat.realnode import ControlPlane

    driver = "gpu.example.com"
    with ControlPlane(37, folder / "cp") as plane:
        plane.ensure("/api/v1/nodes", {"metadata": {"name": NODE}})  # as go_dra's, its owner
        config = folder / "dra.yaml"
        config.write_text(
            yaml.safe_dump({
                "resources": [{"name": RESOURCE, "static": {"count": 8}}],
                "plugins_registry_dir": str(folder / "registry"),
                "dra": {"node_name": NODE, "kubeconfig": str(plane.admin_kubeconfig),
                        "plugins_dir": str(folder / "plugins"), "cdi_dir": str(folder / "cdi"),
                        "drivers": [{"name": driver, "resources": [RESOURCE], "device_plugin": False}]},
            })
        )  # fmt: skip
        (folder / "dp").mkdir()
        async with running(await start_devshim(folder / "dp", config=config)) as proc:
            socket = folder / "plugins" / driver / "dra.sock"
            slices = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={NODE}"
            began = time.monotonic()
            while not (socket.exists() and plane.request("GET", slices)["items"]):
                if proc.returncode is not None or time.monotonic() - began > 120:
                    why = "running" if proc.returncode is None else f"exit {proc.returncode}"
                    raise RuntimeError(f"devshim published nothing within 120 s ({why})")
                await asyncio.sleep(0.2)
            return await _measure([proc.pid], idle_s, change_s, None)


async def go_dra(folder: Path, idle_s: float, change_s: float) -> dict[str, float]:
    """upstream's own DRA test driver (test/e2e/dra/test-driver, on the kubeletplugin helper of
    k8s.io/dynamic-resource-allocation, as vendors' drivers are; built from the judge's 1.37
    module) publishing 8 devices to the same API server: the Go helper driver DRA is held to."""
    from bench.dra import NODE
    from shim.compat.realnode import ControlPlane
    from shim.compat.upstream import releases

    [release] = [r for r in releases.releases() if r.minor == 37]
    binary = await asyncio.to_thread(releases.build_dra_test_driver, release, log=False)
    driver = "test-driver.cdi.k8s.io"
    with ControlPlane(37, folder / "cp") as plane:
        plane.ensure("/api/v1/nodes", {"metadata": {"name": NODE}})  # the helper publishes for a Node only
        for made in (folder / "plugins" / driver, folder / "registry", folder / "cdi"):
            made.mkdir(parents=True)
        argv = [str(binary), "--drivername", driver, "kubelet-plugin",
                "--plugin-registration-path", str(folder / "registry"), "--datadir", str(folder / "plugins"),
                "--cdi-dir", str(folder / "cdi"), "--node-name", NODE, "--num-devices", "8"]  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(plane.admin_kubeconfig)}
        with (folder / "driver.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=log, stderr=log)
        async with running(proc):
            slices = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={NODE}"
            began = time.monotonic()
            while not plane.request("GET", slices)["items"]:
                if proc.returncode is not None or time.monotonic() - began > 120:
                    why = "running" if proc.returncode is None else f"exit {proc.returncode}"
                    raise RuntimeError(f"the test driver published nothing within 120 s ({why})")
                await asyncio.sleep(0.2)
            return await _measure([proc.pid], idle_s, change_s, None)


ARMS = {"floor": floor, "goplug": goplug, "static": static, "driver": driver, "dra": dra, "go_dra": go_dra}


async def nodecost(quick: bool) -> Result:
    idle_s, change_s = (10.0, 10.0) if quick else (60.0, 30.0)
    figures: dict[str, dict[str, float]] = {}
    with workdir() as folder:
        for name, arm in ARMS.items():
            arm_dir = folder / name
            arm_dir.mkdir()
            figures[name] = await arm(arm_dir, idle_s, change_s)
    base, mine = figures["floor"], figures["static"]
    over = round(mine["rss_mb"] - base["rss_mb"], 1)
    own = max(figures[a].get("idle_own_wakeups_per_s", 0.0) for a in ("static", "dra"))
    own = max(own, figures["driver"]["devshim_idle_own_wakeups_per_s"])
    dra_over = round(figures["dra"]["rss_mb"] - figures["go_dra"]["rss_mb"], 1)
    met = over <= MEMORY_GOAL_MB and own <= OWN_WAKEUPS_GOAL and dra_over <= 0
    misses = [f"RSS {over - MEMORY_GOAL_MB:.1f} MB over"] if over > MEMORY_GOAL_MB else []
    misses += [f"{own:g} own wake-ups/s"] if own > OWN_WAKEUPS_GOAL else []
    misses += [f"DRA {dra_over:g} MB over the Go helper driver"] if dra_over > 0 else []
    return Result(
        "nodecost: idle RSS, wake-ups and CPU, devshim beside the floor and the Go plugin",
        base,
        mine,
        f"+{over} MB over the floor; DRA {dra_over:+g} MB beside the Go helper; own wake-ups idle {own:g}/s",
        f"≤ +{MEMORY_GOAL_MB:g} MB; DRA ≤ the Go helper's RSS; ≤ {OWN_WAKEUPS_GOAL:g} own wake-up/s idle",
        met,
        by=", ".join(misses),
        note=f"idle {idle_s:g} s, changing {change_s:g} s per arm",
        extra=figures,
    )

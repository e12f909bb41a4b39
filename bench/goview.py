"""Row goclient: Allocate as a Go client sees it, devshim beside the native Go plugin it replaces.

The other Allocate rows time a Python client against a Python echo, so their ratios say nothing
of what a vendor gives up by serving through devshim instead of writing the plugin in Go. Here
bench/goclient (a Go program on the upstream generated client, k8s.io/kubelet's v1beta1, as the
kubelet's endpoint calls it) times one-device Allocates against four sockets, interleaved in
rounds so machine noise hits all alike:

- native: goplug (tests/support/legacy_plugins/go), a vendor-style Go plugin, registered with a
  fake kubelet of its own;
- static: devshim answering from a static resource (no driver);
- sim: devshim asking the sim driver per call (one JSON-RPC round trip to a Python process);
- legacy: devshim asking the legacy adapter, which asks a second goplug (two hops).

The three devshim resources are served by one `devshim run`, registered with one fake kubelet.
Every target grants the same thing (goplug's answer: an env, a device node, a CDI device), so
the replies are alike in size. Informational: no goal, the ratios and the milliseconds added.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from bench.common import (
    BENCH_DIR,
    ROOT,
    Result,
    declared_by,
    ratio,
    running,
    sim_driver,
    start_devshim,
    stats_ms,
    workdir,
    write_config,
)
from shim.compat.fakekubelet import DeviceState, FakeKubelet

GOCLIENT = BENCH_DIR / "goclient"
GOPLUG = ROOT / "tests" / "support" / "legacy_plugins" / "go"
BUILT = GOCLIENT / "build"  # git-ignored (build/)
BUILD_TIMEOUT_S = 600.0  # a cold Go module cache downloads grpc and k8s.io/kubelet first
NATIVE = "example.com/goplug"  # goplug's resource, native and behind the legacy adapter
STATIC = "example.com/go-static"
SIM = "example.com/go-sim"
DEVICE = "g1"  # goplug lists g0, g1, g2; the devshim resources list the same IDs
TARGETS = ("native", "static", "sim", "legacy")
# goplug's own answer, as a template, so every target's reply is the same bytes' worth.
GRANT = {
    "envs": {"GOPLUG_DEVICES": "{ids}"},
    "device_nodes": [{"container_path": "/dev/goplug/{id}", "host_path": "/dev/null", "permissions": "rw"}],
    "cdi_devices": ["example.com/goplug={id}"],
}


def _source_hash(module: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted([*module.glob("*.go"), module / "go.mod", module / "go.sum", module / "build.sh"]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def go_build(module: Path, name: str) -> Path:
    """``name``, built by ``module``'s build.sh into bench/goclient/build once per version of its
    sources (the binary is named by their hash), so a rerun starts at once."""
    target = BUILT / f"{name}-{_source_hash(module)}"
    if target.is_file():
        return target
    BUILT.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    argv = ["bash", str(module / "build.sh"), str(partial)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"{module}/build.sh failed: {done.stderr.strip()[-2000:]}")
    partial.replace(target)  # atomic: a concurrent run finds the whole binary or none
    for stale in BUILT.glob(f"{name}-*"):  # earlier versions' binaries, 15 MB each
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


def _all_healthy(devices: Sequence[DeviceState]) -> bool:
    return len(devices) == 3 and all(d.healthy for d in devices)


def counts(quick: bool) -> tuple[int, int, int]:
    """calls per target, rounds, warm-up calls per target"""
    return (400, 4, 50) if quick else (3000, 10, 200)


def _devshim_config(work: Path, goplug: Path) -> Path:
    """One devshim: the static resource, the sim per call, and the legacy adapter before goplug."""
    private = work / "legacy"  # the adapter's kubelet directory, where its goplug registers
    private.mkdir()
    legacy = [sys.executable, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private)]
    legacy += ["--plugin-env", f"DP_DIR={private}", "--", str(goplug)]
    sim = {"name": SIM, "grant_mode": "per_call", "count": 3, "id_prefix": "g", "grant": GRANT}
    static = {"name": STATIC, "static": {"count": 3, "id_prefix": "g", "grant": GRANT}}
    drivers = {
        "sim": sim_driver(work, [sim]),
        "legacy": {"user": "root", "command": legacy, "resources": [NATIVE], "policy": declared_by([GRANT])},
    }
    return write_config(work / "devshim.yaml", drivers, resources=[static])


@contextlib.asynccontextmanager
async def serving(work: Path, goplug: Path) -> AsyncIterator[dict[str, Path]]:
    """The four targets, each registered and listing its three devices healthy: target -> socket."""
    native_dir, plugin_dir = work / "native", work / "dp"
    config = _devshim_config(work, goplug)
    env = {**os.environ, "DP_DIR": str(native_dir)}  # goplug's own way to its kubelet directory
    async with (
        FakeKubelet(native_dir) as native_kubelet,
        FakeKubelet(plugin_dir) as kubelet,
        running(await start_devshim(plugin_dir, config=config)),
    ):
        with (work / "goplug.log").open("ab") as log:  # goplug logs every Allocate, as vendors do
            plugin = await asyncio.create_subprocess_exec(str(goplug), env=env, stderr=log)
        async with running(plugin):
            sockets = {}
            for name, where, resource in (
                ("native", native_kubelet, NATIVE),
                ("static", kubelet, STATIC),
                ("sim", kubelet, SIM),
                ("legacy", kubelet, NATIVE),
            ):
                session = await where.wait_for_plugin(resource, timeout=60)
                await session.wait_for_list(_all_healthy, timeout=60)
                sockets[name] = where.plugin_dir / session.endpoint
            yield sockets


async def time_from_go(
    client: Path, sockets: dict[str, Path], calls: int, rounds: int, warmup: int
) -> dict[str, list[float]]:
    """bench/goclient's samples (seconds per call) of each target, all targets interleaved."""
    argv = [str(client), f"-calls={calls}", f"-rounds={rounds}", f"-warmup={warmup}", f"-device={DEVICE}"]
    argv += [f"{name}={path}" for name, path in sockets.items()]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(300):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError("goclient: no answer within 300 s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"goclient exited {proc.returncode}: {err.decode(errors='replace').strip()}")
    samples: dict[str, list[float]] = json.loads(out)
    if set(samples) != set(sockets):
        raise RuntimeError(f"goclient answered for {sorted(samples)}, not {sorted(sockets)}")
    return samples


def judge(samples: dict[str, list[float]]) -> Result:
    stats = {name: stats_ms(samples[name]) for name in TARGETS}
    base = stats["native"]
    ours = {f"{name} {q}_ms": stats[name][f"{q}_ms"] for name in TARGETS[1:] for q in ("p50", "p99")}
    at = {
        q: ", ".join(f"{name} {ratio(stats[name][f'{q}_ms'], base[f'{q}_ms'])}x" for name in TARGETS[1:])
        for q in ("p50", "p99")
    }
    added = ", ".join(f"{name} +{stats[name]['p50_ms'] - base['p50_ms']:.2f}" for name in TARGETS[1:])
    return Result(
        "Allocate from a Go client: devshim vs a native Go plugin",
        {"native p50_ms": base["p50_ms"], "native p99_ms": base["p99_ms"]},
        ours,
        f"p50 {at['p50']}; p99 {at['p99']}",
        "none: states what a user gives up against a native Go plugin",
        None,
        note=f"ms added per Allocate at p50 over the native plugin: {added}; "
        "client: bench/goclient (Go, k8s.io/kubelet v1beta1 client), targets interleaved",
        extra={"targets": stats},
    )


async def goclient(quick: bool) -> Result:
    client = await asyncio.to_thread(go_build, GOCLIENT, "goclient")
    goplug = await asyncio.to_thread(go_build, GOPLUG, "goplug")
    with workdir() as work:
        async with serving(work, goplug) as sockets:
            samples = await time_from_go(client, sockets, *counts(quick))
    return judge(samples)

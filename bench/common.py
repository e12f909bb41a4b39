"""Shared bits of the benchmarks: the result record, percentiles, A/B rounds, devshim as a subprocess."""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shim.compat.realnode.node import free_port as free_port  # re-exported for the rows

BENCH_DIR = Path(__file__).parent
ROOT = BENCH_DIR.parent  # the working directory of every process started here (for -m bench.*)
Call = Callable[[], Awaitable[object]]


@dataclass
class Result:
    """One row of the table: figures of the baseline and of devshim, and the goal's verdict."""

    name: str
    baseline: dict[str, float]
    devshim: dict[str, float]
    value: str  # the ratio or absolute figure the goal is judged on
    goal: str
    met: bool | None  # None: nothing to judge (the row failed, or only reports)
    by: str = ""  # how far from the goal, e.g. "0.12x over"
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def stats_ms(samples: Sequence[float]) -> dict[str, float]:
    """n, p50, p99 and max in milliseconds of samples given in seconds."""
    return {
        "n": len(samples),
        "p50_ms": round(statistics.median(samples) * 1000, 3),
        "p99_ms": round(percentile(samples, 99) * 1000, 3),
        "max_ms": round(max(samples) * 1000, 3),
    }


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("inf")


async def timed(call: Call, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def interleaved(
    arms: Mapping[str, Call], calls: int, rounds: int, warmup: int
) -> dict[str, list[float]]:
    """Each arm ``warmup`` calls, then ``calls`` in ``rounds`` alternating rounds; seconds per call."""
    results: dict[str, list[float]] = {name: [] for name in arms}
    for call in arms.values():
        await timed(call, warmup)
    for _ in range(rounds):
        for name, call in arms.items():
            results[name] += await timed(call, max(1, calls // rounds))
    return results


@contextlib.contextmanager
def workdir() -> Any:
    path = Path(tempfile.mkdtemp(prefix="ds-bench-", dir="/tmp"))
    try:
        yield path
    finally:
        if os.environ.get("DEVSHIM_BENCH_KEEP"):  # its logs, for a row that failed or surprised
            print(f"bench: kept {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


def write_config(
    path: Path, drivers: dict[str, dict[str, Any]], restart: dict[str, Any] | None = None, **settings: Any
) -> Path:
    """A devshim settings file running ``drivers`` (name -> its entry: command, resources and
    policy, as sim_driver and bench_driver make them; each with the ``restart`` policy if given),
    with more settings."""
    entries = [{"name": n, **d, **({"restart": restart} if restart else {})} for n, d in drivers.items()]
    path.write_text(yaml.safe_dump({"drivers": entries, **settings}))
    return path


def sim_command(workdir: Path, resources: list[dict[str, Any]]) -> list[str]:
    """The simulated driver (devshim_adapters.sim) serving ``resources`` (its config's list)."""
    sim = workdir / "sim.yaml"
    sim.write_text(yaml.safe_dump({"resources": resources}))
    return [sys.executable, "-m", "devshim_adapters.sim", "--config", str(sim)]


def declared_by(grants: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The grant policy allowing exactly what these sim-style grant templates hold."""
    policy = {
        "envs": sorted({name for g in grants for name in g.get("envs", {})}),
        "device_nodes": sorted({n["host_path"] for g in grants for n in g.get("device_nodes", [])}),
        "mounts": sorted({m["host_path"] for g in grants for m in g.get("mounts", [])}),
        "cdi_kinds": sorted({name.partition("=")[0] for g in grants for name in g.get("cdi_devices", [])}),
    }
    return {key: value for key, value in policy.items() if value}


def sim_driver(workdir: Path, resources: list[dict[str, Any]]) -> dict[str, Any]:
    """The sim's drivers[] entry: its command, the resources it serves and what they grant."""
    grants = [r["grant"] for r in resources if "grant" in r]
    return {
        "user": "root",
        "command": sim_command(workdir, resources),
        "resources": [r["name"] for r in resources],
        "policy": declared_by(grants),
    }


def bench_driver_command(stamps: Path, resources: dict[str, int]) -> list[str]:
    """bench/driver.py: GPU-like devices, a health flip on SIGUSR1 (stamped in ``stamps``)."""
    args = [f"--resource={name}={count}" for name, count in resources.items()]
    return [sys.executable, "-m", "bench.driver", f"--stamps={stamps}", *args]


def bench_driver(stamps: Path, resources: dict[str, int]) -> dict[str, Any]:
    """bench/driver.py's drivers[] entry (its grants are empty: no policy needed)."""
    return {"user": "root", "command": bench_driver_command(stamps, resources), "resources": list(resources)}


def cpu_ticks(pid: int) -> int:
    """User plus system CPU ``pid`` has used, in clock ticks (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def compile_bytecode() -> None:
    """Write the bytecode an installed devshim has: pip compiles it at install, but a checkout
    run with PYTHONDONTWRITEBYTECODE (as this project's machines are) has every spawned process
    compile some 60 of devshim's modules from source, about 50 ms and some MB of each start."""
    for folder in ("src", "adapters", "bench"):
        compileall.compile_dir(ROOT / folder, quiet=1)


async def start_devshim(
    plugin_dir: Path,
    *resources: str,
    config: Path | None = None,
    http_port: int = 0,
    deallocation: bool = False,
) -> asyncio.subprocess.Process:
    """``devshim run`` with its state and its log (stderr, drivers' included) beside
    ``plugin_dir`` (devshim_log), its ops endpoint on ``http_port`` (0: any free port, never 9477).
    Deallocate emulation is off unless ``deallocation`` (then the config names the PodResources
    socket): most rows' drivers declare no deallocate, and no kubelet serves PodResources."""
    args = [sys.executable, "-m", "shim", "run", "--device-plugins-dir", str(plugin_dir)]
    args += ["--state-dir", str(plugin_dir.parent / f"state-{plugin_dir.name}"), "--log-level", "WARNING"]
    for resource in resources:
        args += ["-r", resource]
    if config is not None:
        args += ["--config", str(config)]
    env = {
        **os.environ,
        "DEVSHIM_HTTP__PORT": str(http_port),
        "DEVSHIM_HTTP__HOST": "127.0.0.1",
    }
    if not deallocation:
        env["DEVSHIM_DEALLOCATION__ENABLED"] = "false"
    with devshim_log(plugin_dir).open("ab") as stderr:
        return await asyncio.create_subprocess_exec(*args, env=env, cwd=ROOT, stderr=stderr)


def devshim_log(plugin_dir: Path) -> Path:
    return plugin_dir.parent / f"devshim-{plugin_dir.name}.log"


@contextlib.asynccontextmanager
async def running(proc: asyncio.subprocess.Process) -> AsyncIterator[asyncio.subprocess.Process]:
    try:
        yield proc
    finally:
        await stop(proc)


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (devshim's drivers)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


_UNITS = (("_per_s", "/s"), ("_mib", " MiB"), ("_mb", " MB"), ("_ms", " ms"), ("_us", " µs"), ("_s", " s"))


def number(value: float) -> str:
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def fmt(figures: dict[str, float]) -> str:
    """Figures for the table: "p50 1.09 ms, p99 4.51 ms" (n and max left to the JSON)."""
    parts = []
    for key, value in figures.items():
        if key == "n" or key.startswith("max"):
            continue
        name, unit = key, ""
        for suffix, shown in _UNITS:
            if key.endswith(suffix):
                name, unit = key.removesuffix(suffix), shown
                break
        parts.append(f"{name.replace('_', ' ')} {number(value)}{unit}")
    return ", ".join(parts)


def verdict(result: Result) -> str:
    if result.met is None:
        return "n/a" if not result.note.startswith("failed") else "FAILED"
    return "MET" if result.met else f"MISSED ({result.by})" if result.by else "MISSED"


def table(results: list[Result]) -> str:
    lines = ["| row | baseline | devshim | value | goal | result |", "|---|---|---|---|---|---|"]
    for r in results:
        cells = [r.name, fmt(r.baseline) or "—", fmt(r.devshim), r.value, r.goal, verdict(r)]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    notes = [f"- {r.name}: {r.note}" for r in results if r.note]
    return "\n".join(lines + ([""] + notes if notes else []))


def print_row(result: Result, json_file: Path | None) -> None:
    """A row run on its own (``python -m bench.<row>``): its table, the machine, and with
    ``--json`` every figure written to ``json_file``."""
    import platform

    import grpc

    print(table([result]))
    print(f"\n{os.cpu_count()} CPUs, Python {platform.python_version()}, grpcio {grpc.__version__}")
    if json_file is not None:
        json_file.write_text(json.dumps(result.as_json(), indent=1) + "\n")

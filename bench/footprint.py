"""Rows footprint and startup: what one node pays for devshim, beside the floors it cannot go under.

footprint: VmRSS of `devshim run` idle with one static resource (8 devices, and 10,000), of an SDK
driver (bench/driver.py) and of the sim driver idle, each beside its floor measured in the same run:
a fresh interpreter that imports what the process cannot do without (devshim: asyncio, grpcio,
loguru, tenacity, and pydantic with a model validated, as its config is; a driver: asyncio, and
asyncio with the two packages the SDK is made of, betterproto2 and loguru; the sim: those with
pydantic and yaml, for its config). The share of
each of devshim's own imports (RSS after importing it, in import order) goes to the row's extra.

startup: `devshim run` spawned → its first Register received by the fake kubelet, with a static
resource, and with the sim driver (the driver's share: the difference), beside the floor: the same
for bench/minimal_plugin.py, the least a Python v1beta1 plugin does to register; median of RUNS,
alternating.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.common import (
    ROOT,
    Result,
    bench_driver,
    children,
    compile_bytecode,
    running,
    sim_driver,
    start_devshim,
    workdir,
    write_config,
)
from bench.memory import rss_mb
from shim.compat.fakekubelet import FakeKubelet

RESOURCE = "example.com/gpu"
DEVSHIM_GOAL_MB = 40.0
DRIVER_GOAL_MB = 20.0
STARTUP_GOAL_MS = 300.0
RUNS = 5
SETTLE_S = 1.0  # after the first list: state written, the loops idle

# The interpreter's own VmRSS in kB, as a snippet the measured interpreter runs.
Spawn = Callable[[Path], Awaitable[asyncio.subprocess.Process]]  # a plugin process for a plugin dir
_RSS_KB = (
    "def rss_kb():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmRSS:'):\n"
    "            return int(line.split()[1])\n"
)
# What a devshim process cannot do without: its serving loop, gRPC, its log, its retries, and its
# config validated (pydantic builds a model's validator on first use, which is most of its cost).
DEVSHIM_FLOOR = (
    "import asyncio, grpc.aio, loguru, tenacity, pydantic\nclass M(pydantic.BaseModel):\n    x: int\nM(x=1)\n"
)
DRIVER_FLOOR = "import asyncio\n"
# What the SDK is made of, both packages the project fixes: its message types (betterproto2, kept
# from loading pydantic as shim.sdk does) and its log (loguru); the nearest honest goal for a driver.
SDK_FLOOR = (
    "import asyncio, sys\nsys.modules['pydantic'] = None\nimport betterproto2\n"
    "del sys.modules['pydantic']\nimport loguru\n"
)
# The sim validates its YAML config with pydantic, as devshim does its own (shim.sdk.config).
SIM_FLOOR = SDK_FLOOR + "import yaml, pydantic\nclass M(pydantic.BaseModel):\n    x: int\nM(x=1)\n"
MANY_DEVICES = 10_000
MANY_GOAL_MB = 50.0
# devshim's own imports, in the order `devshim run` takes them, after the floor.
SHARES = (
    "shim.settings", "typer", "shim.ops.metrics", "shim.node.dirwatch", "shim.core.resource",
    "shim.status", "shim.bootstrap", "shim.cli", "shim.deviceplugin.v1beta1",
)  # fmt: skip


def _python_rss_mb(code: str) -> float:
    """VmRSS in MB of a fresh interpreter that ran ``code``."""
    return round(int(_run(code + _RSS_KB + "print(rss_kb())").split()[-1]) / 1024, 1)


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return done.stdout


def import_shares() -> dict[str, float]:
    """MB each of devshim's imports adds after the floor, in import order (one interpreter)."""
    code = (
        DEVSHIM_FLOOR
        + _RSS_KB
        + (
            f"import importlib\nlast = rss_kb()\nfor name in {list(SHARES)!r}:\n"
            "    importlib.import_module(name)\n    now = rss_kb()\n"
            "    print(name, now - last)\n    last = now\n"
        )
    )
    lines = _run(code).splitlines()
    return {name: round(int(kb) / 1024, 1) for name, kb in (line.split() for line in lines)}


async def _idle(
    work: Path, name: str, config: Path | None, resources: tuple[str, ...]
) -> tuple[float, float | None]:
    """RSS in MB of an idle devshim (and of its driver, if any) once the kubelet has its list."""
    plugin_dir = work / name
    async with (
        FakeKubelet(plugin_dir) as kubelet,
        running(await start_devshim(plugin_dir, *resources, config=config)) as devshim,
    ):
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=60)
        await session.wait_for_list(timeout=60)
        await asyncio.sleep(SETTLE_S)
        drivers = children(devshim.pid)
        return rss_mb(devshim.pid), rss_mb(drivers[0]) if drivers else None


def _sim(work: Path) -> Path:
    sim = sim_driver(work, [{"name": RESOURCE, "count": 8}])
    return write_config(work / "sim-devshim.yaml", {"sim": sim})


async def footprint(quick: bool) -> Result:
    with workdir() as work:
        static, _ = await _idle(work, "static", None, (f"{RESOURCE}=8",))
        many, _ = await _idle(work, "many", None, (f"{RESOURCE}={MANY_DEVICES}",))
        _, sim = await _idle(work, "sim", _sim(work), ())
        plain = write_config(work / "sdk.yaml", {"sdk": bench_driver(work / "stamps", {RESOURCE: 8})})
        _, driver = await _idle(work, "sdk", plain, ())
    floor, driver_floor = _python_rss_mb(DEVSHIM_FLOOR), _python_rss_mb(DRIVER_FLOOR)
    sdk_floor, sim_floor = _python_rss_mb(SDK_FLOOR), _python_rss_mb(SIM_FLOOR)
    assert driver is not None and sim is not None
    shares = import_shares()
    met = static <= DEVSHIM_GOAL_MB and many <= MANY_GOAL_MB and driver <= DRIVER_GOAL_MB
    misses = [
        f"devshim {static - DEVSHIM_GOAL_MB:.1f} MB over (its floor alone is {floor} MB)"
        if static > DEVSHIM_GOAL_MB else "",
        f"with {MANY_DEVICES:,} devices {many - MANY_GOAL_MB:.1f} MB over" if many > MANY_GOAL_MB else "",
        f"driver {driver - DRIVER_GOAL_MB:.1f} MB over (asyncio alone is {driver_floor} MB, "
        f"with the SDK's betterproto2 and loguru {sdk_floor} MB)"
        if driver > DRIVER_GOAL_MB else "",
    ]  # fmt: skip
    return Result(
        "idle RSS: devshim (static; 8 and 10k devices), an SDK driver (bench/driver.py), the sim",
        {
            "devshim_floor_mb": floor,
            "driver_floor_mb": driver_floor,
            "sdk_floor_mb": sdk_floor,
            "sim_floor_mb": sim_floor,
        },
        {"devshim_mb": static, "devshim_10k_mb": many, "sdk_driver_mb": driver, "sim_driver_mb": sim},
        f"devshim {static} MB ({static - floor:+.1f} over its floor), {many} MB with "
        f"{MANY_DEVICES:,} devices; SDK driver {driver} MB ({driver - sdk_floor:+.1f} over the SDK's "
        f"floor), sim {sim} MB ({sim - sim_floor:+.1f} over the SDK's floor with pydantic and yaml)",
        f"devshim ≤ {DEVSHIM_GOAL_MB:g} MB, ≤ {MANY_GOAL_MB:g} MB with {MANY_DEVICES:,} devices; "
        f"SDK driver ≤ {DRIVER_GOAL_MB:g} MB",
        met,
        "; ".join(m for m in misses if m),
        "floors: fresh interpreters importing what each cannot do without (module docstring); "
        "the sim also validates its own config with pydantic",
        {"import_shares_mb": shares},
    )


async def _first_register_ms(work: Path, name: str, spawn: Spawn) -> float:
    """Milliseconds from spawning a plugin process to the fake kubelet receiving its Register."""
    plugin_dir = work / name
    async with FakeKubelet(plugin_dir) as kubelet:
        began = time.monotonic()
        async with running(await spawn(plugin_dir)):
            record = await kubelet.wait_for_registration(RESOURCE, timeout=60)
            return (record.received_at - began) * 1000


def _minimal(plugin_dir: Path) -> Awaitable[asyncio.subprocess.Process]:
    """The floor: bench/minimal_plugin.py, the least a Python v1beta1 plugin does to register."""
    argv = [sys.executable, "-m", "bench.minimal_plugin", str(plugin_dir), RESOURCE]
    return asyncio.create_subprocess_exec(*argv, cwd=ROOT, stderr=asyncio.subprocess.DEVNULL)


async def startup(quick: bool) -> Result:
    runs = 3 if quick else RUNS
    samples: dict[str, list[float]] = {"floor": [], "static": [], "sim": []}
    with workdir() as work:
        config = _sim(work)
        spawns: dict[str, Spawn] = {
            "floor": _minimal,
            "static": lambda plugin_dir: start_devshim(plugin_dir, f"{RESOURCE}=8"),
            "sim": lambda plugin_dir: start_devshim(plugin_dir, config=config),
        }
        for i in range(runs):  # alternating, so the machine's noise hits each alike
            for arm, spawn in spawns.items():
                samples[arm].append(await _first_register_ms(work, f"{arm}{i}", spawn))
    floor, static, sim = (statistics.median(samples[arm]) for arm in ("floor", "static", "sim"))
    met = static <= STARTUP_GOAL_MS
    return Result(
        "start-up: spawned → first Register",
        {"minimal_python_plugin_p50_ms": round(floor, 1)},
        {"static_p50_ms": round(static, 1), "sim_p50_ms": round(sim, 1)},
        f"{static:.0f} ms static ({static - floor:+.0f} over the floor); "
        f"the sim driver adds {sim - static:.0f} ms",
        f"≤ {STARTUP_GOAL_MS:g} ms (static)",
        met,
        "" if met else f"{static - STARTUP_GOAL_MS:.0f} ms over",
        f"median of {runs} spawns each, alternating; the fake kubelet's receive time of the first Register; "
        "floor: bench/minimal_plugin.py",
        {arm: [round(x, 1) for x in xs] for arm, xs in samples.items()},
    )


if __name__ == "__main__":  # python -m bench.footprint: the import shares alone
    compile_bytecode()
    print(json.dumps(import_shares(), indent=2))

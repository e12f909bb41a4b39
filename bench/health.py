"""Row 4: one health change among 10k devices -> the kubelet receives the new list.

devshim serves bench/driver.py (10,000 GPU-like devices); the baseline,
bench/list_server.py, holds the same 10k list as one message and only encodes
and sends it. Both flip one device's health on SIGUSR1 and stamp CLOCK_MONOTONIC
just before they send (the driver its health_changed notification, the baseline
its list); the fake kubelet's client receives both in this process. Measured,
A/B alternating: that stamp -> the ListAndWatchResponse received and parsed
(protobuf, C), which is where a Go kubelet would have it. The fake kubelet's
Python translation of 10k devices into its records (tens of ms; the real
kubelet does not pay it) comes after and is reported apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    Result,
    bench_driver,
    children,
    number,
    ratio,
    running,
    start_devshim,
    stats_ms,
    workdir,
    write_config,
)
from bench.driver import device_ids
from shim.compat.fakekubelet import FakeKubelet, PluginOptions, PluginSession, wire
from shim.compat.fakekubelet.v1beta1 import PluginClientV1Beta1

RESOURCE = "example.com/gpu"
DEVICES = 10_000


async def stamp(stamps: Path, count: int) -> float:
    """The ``count``-th time the process wrote to ``stamps`` (it writes just after sending)."""
    for _ in range(1000):
        lines = stamps.read_text().split() if stamps.exists() else []
        if len(lines) >= count:
            return float(lines[count - 1])
        await asyncio.sleep(0.002)
    raise TimeoutError(f"{stamps}: no stamp {count}")


@contextlib.contextmanager
def arrivals() -> Iterator[list[float]]:
    """CLOCK_MONOTONIC of every ListAndWatch message the fake kubelet's client has parsed,
    taken before it translates the message into its records."""
    times: list[float] = []
    translate = wire.devices_from_proto

    def timed(response: Any) -> Any:
        times.append(time.monotonic())
        return translate(response)

    wire.devices_from_proto = timed
    try:
        yield times
    finally:
        wire.devices_from_proto = translate


async def change(
    session: PluginSession, pid: int, stamps: Path, count: int, times: list[float]
) -> tuple[float, float]:
    """SIGUSR1 to ``pid``; seconds from its stamp to the next list parsed, and to it translated
    into the fake kubelet's records."""
    previous, seen = session.latest, len(times)
    os.kill(pid, signal.SIGUSR1)
    await session.wait_for_list(lambda devices: devices is not previous, timeout=10)
    translated = time.monotonic()
    sent = await stamp(stamps, count)
    return times[seen] - sent, translated - sent


def build_ms() -> float:
    """Milliseconds to build the 10k-device ListAndWatchResponse from scratch in Python, once."""
    from bench.list_server import response

    devices = [(i, n % 4) for n, i in enumerate(device_ids(DEVICES))]
    start = time.perf_counter()
    response(devices, set()).SerializeToString()
    return (time.perf_counter() - start) * 1000


async def baseline_session(work: Path) -> tuple[PluginSession, asyncio.subprocess.Process]:
    path = work / "list.sock"
    args = ["-m", "bench.list_server", str(path), str(work / "base-stamps"), str(DEVICES)]
    proc = await asyncio.create_subprocess_exec(sys.executable, *args, cwd=ROOT)
    for _ in range(500):
        if path.exists():
            break
        await asyncio.sleep(0.02)
    client = PluginClientV1Beta1(path)
    async with asyncio.timeout(10):
        await client.connect()
    session = PluginSession(RESOURCE, path.name, PluginOptions(), client, version="v1beta1")
    session.start()
    return session, proc


async def health_change(quick: bool) -> Result:
    rounds = 20 if quick else 150
    with workdir() as work, arrivals() as times:
        stamps = work / "stamps"
        driver = bench_driver(stamps, {RESOURCE: DEVICES})
        config = write_config(work / "devshim.yaml", {"bench": driver})
        async with (
            FakeKubelet(work / "dp") as kubelet,
            running(await start_devshim(work / "dp", config=config)) as devshim,
        ):
            session = await kubelet.wait_for_plugin(RESOURCE, timeout=60)
            await session.wait_for_list(lambda devices: len(devices) == DEVICES, timeout=60)
            (driver_pid,) = children(devshim.pid)
            base_session, base_proc = await baseline_session(work)
            async with running(base_proc):
                await base_session.wait_for_list(lambda devices: len(devices) == DEVICES, timeout=30)
                ours: list[tuple[float, float]] = []
                base: list[tuple[float, float]] = []
                for n in range(1, rounds + 1):
                    ours.append(await change(session, driver_pid, stamps, n, times))
                    base.append(await change(base_session, base_proc.pid, work / "base-stamps", n, times))
                    await asyncio.sleep(0.01)
                healthy = sum(d.healthy for d in session.latest)
                await base_session.close()
    b, d = stats_ms([t for t, _ in base]), stats_ms([t for t, _ in ours])
    translated = stats_ms([t for _, t in ours])
    met = d["p99_ms"] <= 20
    return Result(
        f"one health change among {DEVICES // 1000}k devices -> list received",
        b,
        d,
        f"p99 {number(d['p99_ms'])} ms ({ratio(d['p50_ms'], b['p50_ms'])}x baseline at p50)",
        "p99 ≤ 20 ms",
        met,
        "" if met else f"p99 {d['p99_ms'] - 20:.1f} ms over",
        f"{rounds} changes each, sender's stamp -> message parsed by the fake kubelet's client; "
        f"baseline: a held 10k message encoded and sent (building it from scratch in Python: "
        f"{build_ms():.0f} ms); with the fake kubelet's own translation into records devshim's "
        f"p50 is {number(translated['p50_ms'])} ms, p99 {number(translated['p99_ms'])} ms; "
        f"{healthy} healthy at the end",
        extra={"devshim_to_records": translated},
    )

"""Row 5: the largest device list within the kubelet's 4 MiB receive limit, and beyond it.

How many GPU-like devices (bench/driver.py's IDs, one NUMA node each) fit in
one v1beta1 ListAndWatchResponse of at most 4 MiB, computed with the generated
stubs; then devshim serves one resource of exactly that many devices (the fake
kubelet, with gRPC's default 4 MiB limit like the kubelet, must receive it)
and one of a single device more: what the fake kubelet sees, how fast, whether
devshim's log names the resource and devshim_list_too_large_total counts it.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request

from bench.common import (
    Result,
    bench_driver,
    devshim_log,
    free_port,
    running,
    start_devshim,
    workdir,
    write_config,
)
from bench.driver import NUMA_NODES, device_ids
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.generated.v1beta1 import api_pb2 as pb

LIMIT = 4 * 1024 * 1024  # gRPC's default receive limit, which the kubelet keeps
FIT = "example.com/gpu-fit"
OVER = "example.com/gpu-over"
STALL_S = 5.0  # an error later than this counts as a stall


def device(device_id: str, n: int) -> pb.Device:
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=n % NUMA_NODES)])
    return pb.Device(ID=device_id, health="Healthy", topology=topology)


def varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def devices_that_fit() -> tuple[int, int]:
    """The most devices whose ListAndWatchResponse is at most LIMIT bytes, and its size."""
    total, ids = 0, device_ids(LIMIT // 40)
    for n, device_id in enumerate(ids):
        size = device(device_id, n).ByteSize()
        entry = 1 + varint_size(size) + size  # field 1's tag, the length, the Device
        if total + entry > LIMIT:
            break
        total += entry
    message = pb.ListAndWatchResponse(devices=[device(i, k) for k, i in enumerate(ids[: n + 1])])
    assert message.ByteSize() > LIMIT, "one device more must not fit"
    del message.devices[-1]
    assert message.ByteSize() == total <= LIMIT, (message.ByteSize(), total)
    return n, total


async def scrape(port: int, metric: str, resource: str) -> float | None:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())

    for line in (await asyncio.to_thread(get)).splitlines():
        if line.startswith(metric) and f'"{resource}"' in line:
            return float(line.split()[-1])
    return None


async def ended(session: PluginSession, timeout: float) -> float | None:
    """Seconds until the session's stream ends, None if it is still open after ``timeout``."""
    start = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            await session.stream_ended.wait()
    except TimeoutError:
        return None
    return time.monotonic() - start


async def list_size(quick: bool) -> Result:
    fit, size = devices_that_fit()
    with workdir() as work:
        driver = bench_driver(work / "stamps", {FIT: fit, OVER: fit + 1})
        config = write_config(work / "devshim.yaml", {"bench": driver})
        port = free_port()
        devshim = await start_devshim(work / "dp", config=config, http_port=port)
        async with FakeKubelet(work / "dp") as kubelet, running(devshim):
            over = await kubelet.wait_for_plugin(OVER, timeout=120)
            seconds = await ended(over, STALL_S * 2)
            session = await kubelet.wait_for_plugin(FIT, timeout=60)
            got = len(await session.wait_for_list(lambda devices: len(devices) == fit, timeout=60))
            await asyncio.sleep(1 if quick else 2)  # does it register again into the same failure?
            registrations = sum(r.resource_name == OVER for r in kubelet.registrations)
            counted = await scrape(port, "devshim_list_too_large_total", OVER)
        logged = OVER in devshim_log(work / "dp").read_text(errors="replace")
    error = over.stream_error if seconds is not None else f"none within {STALL_S * 2:.0f} s (stalled)"
    names = seconds is not None and OVER in (error or "")
    met = fit >= 50_000 and names and seconds is not None and seconds <= STALL_S
    misses = [] if fit >= 50_000 else [f"{50_000 - fit} devices short"]
    if not names:
        misses.append("the stream error does not name the resource")
    elif seconds is None or seconds > STALL_S:
        misses.append("stalled")
    beyond = {
        "fit": fit,
        "error_after_s": round(seconds, 3) if seconds is not None else -1,
        "metric": counted if counted is not None else -1,
    }
    return Result(
        "largest list within 4 MiB; one device beyond",
        {},
        beyond,
        f"{fit:,} fit ({size:,} bytes); beyond: {'an' if names else 'no'} error naming it, "
        f"metric {'counted' if counted else 'absent'}, log line {'yes' if logged else 'no'}",
        f"≥ 50k fit; beyond: an error naming the resource within {STALL_S:.0f} s, a metric, a log line",
        met,
        "; ".join(misses),
        f"devshim delivered the {fit:,}-device list: {got == fit}; one device more, the fake kubelet "
        f"saw {error!r} (its first session); devshim_list_too_large_total={counted}; "
        f"{registrations} Register call(s) of it",
        extra={"error": error, "bytes": size, "fit_list_received": got, "log_names_resource": logged},
    )

"""Row dra_prepare: NodePrepareResources of a one-device claim beside v1beta1 Allocate of another device.

A real kube-apiserver and etcd (release 1.37, shim.compat.realnode.ControlPlane; built on first use,
minutes) and one `devshim run` with the sim serving 4 GPUs (per-call grants, pre-start and
deallocate declared) as the DRA driver gpu.example.com's pool and, through the fake kubelet, as
the device-plugin resource example.com/gpu. One claim per sample (one device, gpu-0, allocated
and reserved as the scheduler leaves it) is created before anything is timed. Per claim, in one
loop, one raw grpc.aio client on each socket (request bytes made ahead, one connection each, as
the kubelet keeps one):

- (a) NodePrepareResources (v1) of the new claim: devshim reads it from the API server, asks the
  sim to allocate and to pre-start, checks the grant, writes the CDI spec and its checkpoint;
  then NodeUnprepareResources of it (timed apart: the sim's deallocate, the checkpoint rewritten,
  the spec removed);
- (b) NodePrepareResources of the same claim again, before the unprepare: the checkpoint's answer;
- (c) v1beta1 Allocate of gpu-3 through devshim's device-plugin socket (one pipe round trip);
  and PreStartContainer of it (the pre-start a prepare also asks, reported in the note);
- (d) the floor of a first prepare: GET of the same claim by this process with devshim's own
  client (shim.dra.kube.ApiServer.get_claim, kr8s over one kept connection).

The arms of the device-plugin side and the GET go before the claim's prepare for even claims and
after its unprepare for odd ones, so neither side always finds the API server or the sim just
woken. Also reported: the CPU per call of each arm in devshim, the driver, kube-apiserver, etcd
and this process (/proc/PID/stat, summed over the arm's calls), and the files a prepare writes,
written here as devshim writes them before its answer (unsynced).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
import yaml

from bench.common import (
    TICK_S,
    Result,
    children,
    cpu_ticks,
    free_port,
    number,
    ratio,
    running,
    sim_driver,
    start_devshim,
    stats_ms,
    workdir,
)
from shim.compat.fakekubelet import FakeKubelet
from shim.compat.realnode import ControlPlane
from shim.dra.kube import ApiServer
from shim.files import write_atomically
from shim.generated.dra.v1 import api_pb2 as dra_pb
from shim.generated.v1beta1 import api_pb2 as dp_pb

DRIVER = "gpu.example.com"
RESOURCE = "example.com/gpu"
NODE = "bench-node"
DEVICE = "gpu-0"
# The device-plugin arm's device: another GPU of the pool, since one a container holds through
# the device plugin is withheld from claims (docs/dra.md, "Both APIs at once").
DP_DEVICE = "gpu-3"
NAMESPACE = "default"
SIM: dict[str, Any] = {
    "name": RESOURCE,
    "devices": [{"id": f"gpu-{i}"} for i in range(4)],
    "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
    "prestart": True,
    "deallocate": True,
}
SERVICE = dra_pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
ALLOCATE = dp_pb.AllocateRequest(
    container_requests=[dp_pb.ContainerAllocateRequest(devices_ids=[DP_DEVICE])]
).SerializeToString()
PRESTART = dp_pb.PreStartContainerRequest(devices_ids=[DP_DEVICE]).SerializeToString()
ARMS = ("prepare", "again", "unprepare", "allocate", "prestart", "get")
# Whose CPU each arm's calls cost: "bench" is this process (the client of every arm).
PROCESSES = ("devshim", "driver", "kube-apiserver", "etcd", "bench")


@dataclass(frozen=True)
class Claim:
    name: str
    uid: str
    prepare: bytes  # NodePrepareResourcesRequest naming it, serialized
    unprepare: bytes


async def dra_prepare(quick: bool, claims: int | None = None) -> Result:
    count = claims or (50 if quick else 200)
    warmup = 5 if quick else 20
    with workdir() as folder, ControlPlane(37, folder / "cp") as plane:
        made = [make_claim(plane, f"bench-{i}") for i in range(warmup + count)]
        async with serving(folder, plane) as s:
            version = (await s.api.served_versions("resourceclaims"))[0]
            for claim in made[:warmup]:
                await s.one(claim, version, first=True, files=False)
            s.clear()
            for i, claim in enumerate(made[warmup:]):
                await s.one(claim, version, first=i % 2 == 0, files=True)
            samples, cpu = s.samples, s.cpu
    return _result(samples, cpu, count)


class Setup:
    """The two sockets, the API client, devshim's and the driver's PIDs; the samples per arm."""

    def __init__(
        self, dra: grpc.aio.Channel, dp: grpc.aio.Channel, api: ApiServer, pids: dict[str, int], files: Path
    ) -> None:
        self._prepare = dra.unary_unary(f"/{SERVICE}/NodePrepareResources", None, None)
        self._unprepare = dra.unary_unary(f"/{SERVICE}/NodeUnprepareResources", None, None)
        self._allocate = dp.unary_unary("/v1beta1.DevicePlugin/Allocate", None, None)
        self._prestart = dp.unary_unary("/v1beta1.DevicePlugin/PreStartContainer", None, None)
        self.dra, self.dp = dra, dp
        self.api, self.pids, self.files = api, pids, files
        self.samples: dict[str, list[float]] = {}
        self.cpu: dict[str, dict[str, int]] = {}
        self.clear()

    def clear(self) -> None:
        self.samples = {arm: [] for arm in (*ARMS, "files")}
        self.cpu = {arm: dict.fromkeys(PROCESSES, 0) for arm in ARMS}  # clock ticks per process

    async def _timed(self, arm: str, call: Callable[[], Awaitable[Any]]) -> Any:
        before = _ticks(self.pids)
        start = time.perf_counter()
        answer = await call()
        self.samples[arm].append(time.perf_counter() - start)
        after = _ticks(self.pids)
        for name, ticks in after.items():
            self.cpu[arm][name] += ticks - before[name]
        return answer

    async def one(self, claim: Claim, version: str, *, first: bool, files: bool) -> None:
        """Every arm once for ``claim``: the device-plugin side and the GET before the claim's
        prepare (``first``) or after its unprepare."""
        if first:
            await self._others(claim, version)
        raw = await self._timed("prepare", lambda: self._prepare(claim.prepare, timeout=30))
        again = await self._timed("again", lambda: self._prepare(claim.prepare, timeout=30))
        if files:
            self._write_files(claim)
        undone = await self._timed("unprepare", lambda: self._unprepare(claim.unprepare, timeout=30))
        if not first:
            await self._others(claim, version)
        for answer in (raw, again):
            prepared = dra_pb.NodePrepareResourcesResponse.FromString(answer).claims[claim.uid]
            if prepared.error or [d.device_name for d in prepared.devices] != [DEVICE]:
                raise RuntimeError(f"claim {claim.name}: {prepared}")
        error = dra_pb.NodeUnprepareResourcesResponse.FromString(undone).claims[claim.uid].error
        if error:
            raise RuntimeError(f"claim {claim.name}: unprepare: {error}")

    async def _others(self, claim: Claim, version: str) -> None:
        await self._timed("allocate", lambda: self._allocate(ALLOCATE, timeout=30))
        await self._timed("prestart", lambda: self._prestart(PRESTART, timeout=30))
        got = await self._timed("get", lambda: self.api.get_claim(version, NAMESPACE, claim.name))
        if got["metadata"]["uid"] != claim.uid:
            raise RuntimeError(f"claim {claim.name}: GET answered {got['metadata']}")

    def _write_files(self, claim: Claim) -> None:
        """What a prepare waits for, as devshim writes it, one after another: the checkpoint
        (preparing), the CDI spec, the checkpoint (prepared), each whole and unsynced (synced
        after the answer), with devshim's own bytes for it (dra/preparer.py writes the last
        two at once)."""
        checkpoint = (self.files.parent / "state-dp" / "dra" / f"{DRIVER}.json").read_bytes()
        spec = (self.files.parent / "cdi" / f"devshim-{DRIVER}-{claim.uid}.json").read_bytes()
        start = time.perf_counter()
        write_atomically(self.files / "checkpoint.json", checkpoint, mode=0o600, synced=False)
        write_atomically(self.files / "spec.json", spec, mode=0o644, synced=False)
        write_atomically(self.files / "checkpoint.json", checkpoint, mode=0o600, synced=False)
        self.samples["files"].append(time.perf_counter() - start)


@contextlib.asynccontextmanager
async def serving(
    folder: Path,
    plane: ControlPlane,
    sim: list[dict[str, Any]] | None = None,
    dial: str = RESOURCE,
    both_apis: bool = True,
) -> AsyncIterator[Setup]:
    """devshim serving the sim as the DRA driver and as device-plugin resources to a fake kubelet.

    ``sim``: the sim's resources (default [SIM]), the first the DRA driver's pool; ``dial``: the
    device-plugin resource whose socket Setup.dp is connected to; ``both_apis``: the pool's
    resource served through the device plugin API too (the DRA driver's ``device_plugin``)."""
    sim = sim or [SIM]
    plugin_dir, port = folder / "dp", free_port()
    pod_resources = folder / "pod-resources.sock"
    config = _config(folder, plane, sim, both_apis, pod_resources)
    # A pool served through both APIs needs the deallocate emulation (settings refuse it off),
    # which reads the fake kubelet's PodResources.
    async with (
        FakeKubelet(plugin_dir, pod_resources_socket=pod_resources) as kubelet,
        running(
            await start_devshim(plugin_dir, config=config, http_port=port, deallocation=both_apis)
        ) as proc,
    ):
        session = await kubelet.wait_for_plugin(dial, timeout=60)
        await session.wait_for_list()
        sock = folder / "plugins" / DRIVER / "dra.sock"
        await _until_published(port, sock, len(sim[0]["devices"]))
        driver_pid = children(proc.pid)
        if len(driver_pid) != 1:
            raise RuntimeError(f"devshim's children: {driver_pid}, not the sim alone")
        api = await ApiServer.connect(plane.admin_kubeconfig)
        (folder / "files").mkdir()
        async with (
            grpc.aio.insecure_channel(f"unix:{sock}") as dra,
            grpc.aio.insecure_channel(f"unix:{plugin_dir / session.endpoint}") as dp,
        ):
            pids = {"devshim": proc.pid, "driver": driver_pid[0], **plane.pids, "bench": os.getpid()}
            yield Setup(dra, dp, api, pids, folder / "files")


def _config(
    folder: Path, plane: ControlPlane, sim: list[dict[str, Any]], both_apis: bool, pod_resources: Path
) -> Path:
    """The sim serving ``sim`` (its resources, their grants declared), the first the DRA pool."""
    settings: dict[str, Any] = {
        "plugins_registry_dir": str(folder / "registry"),
        "deallocation": {"pod_resources_socket": str(pod_resources)},
        "drivers": [{"name": "sim", **sim_driver(folder, sim)}],
        "dra": {
            "node_name": NODE,
            "kubeconfig": str(plane.admin_kubeconfig),
            "plugins_dir": str(folder / "plugins"),
            "cdi_dir": str(folder / "cdi"),
            "drivers": [{"name": DRIVER, "resources": [sim[0]["name"]], "device_plugin": both_apis}],
        },
    }
    path = folder / "devshim.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


async def _until_published(port: int, sock: Path, devices: int, timeout: float = 120) -> None:
    """devshim's /status: the pool written once and the DRA socket served (so nothing of the
    start-up overlaps the timed calls)."""
    async with asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(OSError, KeyError, TypeError, ValueError):
                body = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/status")
                status = orjson.loads(body)["dra"][DRIVER]
                if status["devices"] == devices and status["writes"] >= 1 and sock.exists():
                    return
            await asyncio.sleep(0.05)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def make_claim(plane: ControlPlane, name: str, device: str = DEVICE) -> Claim:
    """A v1 ResourceClaim of one device (``device``, by default gpu-0, of this node's pool),
    allocated and reserved for a pod as the scheduler leaves it (tests/support/dra.py make_claim,
    in short)."""
    path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }
    claim = plane.request("POST", path, body)
    claim["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]}
        },
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": f"{name}-pod-uid"}],
    }
    plane.request("PUT", f"{path}/{name}/status", claim)
    ref = dra_pb.Claim(namespace=NAMESPACE, name=name, uid=claim["metadata"]["uid"])
    return Claim(
        name,
        ref.uid,
        dra_pb.NodePrepareResourcesRequest(claims=[ref]).SerializeToString(),
        dra_pb.NodeUnprepareResourcesRequest(claims=[ref]).SerializeToString(),
    )


def _ticks(pids: dict[str, int]) -> dict[str, int]:
    """utime + stime of each process, in clock ticks."""
    return {name: cpu_ticks(pid) for name, pid in pids.items()}


def _result(samples: dict[str, list[float]], cpu: dict[str, dict[str, int]], count: int) -> Result:
    s = {arm: stats_ms(values) for arm, values in samples.items()}
    c_, p_, d_, f_ = samples["allocate"], samples["prestart"], samples["get"], samples["files"]
    sums = {
        "allocate+get": stats_ms([c + d for c, d in zip(c_, d_, strict=True)]),
        "allocate+prestart+get": stats_ms([c + p + d for c, p, d in zip(c_, p_, d_, strict=True)]),
        "allocate+prestart+get+files": stats_ms(
            [c + p + d + f for c, p, d, f in zip(c_, p_, d_, f_, strict=True)]
        ),
    }
    a, b, c, cd = s["prepare"], s["again"], s["allocate"], sums["allocate+get"]

    def both(x: dict[str, float], y: dict[str, float]) -> str:
        return (
            f"{number(ratio(x['p50_ms'], y['p50_ms']))}x p50, {number(ratio(x['p99_ms'], y['p99_ms']))}x p99"
        )

    per_call = {
        arm: {name: round(n * TICK_S * 1000 / count, 2) for name, n in ticks.items()}
        for arm, ticks in cpu.items()
    }
    cpu_note = "; ".join(
        f"{arm} " + "/".join(f"{v:.1f}" for v in each.values()) for arm, each in per_call.items()
    )
    return Result(
        "dra_prepare: NodePrepareResources, 1 device, beside Allocate",
        {
            "allocate_p50_ms": c["p50_ms"],
            "allocate_p99_ms": c["p99_ms"],
            "get_p50_ms": s["get"]["p50_ms"],
            "get_p99_ms": s["get"]["p99_ms"],
        },
        {
            "prepare_p50_ms": a["p50_ms"],
            "prepare_p99_ms": a["p99_ms"],
            "unprepare_p50_ms": s["unprepare"]["p50_ms"],
            "unprepare_p99_ms": s["unprepare"]["p99_ms"],
            "again_p50_ms": b["p50_ms"],
            "again_p99_ms": b["p99_ms"],
        },
        f"(a)/(c) {both(a, c)}; (a)/((c)+(d)) {both(a, cd)}; (b)/(c) {both(b, c)}",
        "reported",
        None,
        note=(
            f"{count} claims, one device each. (c)+(d) is per claim, Allocate and GET of the same "
            f"claim summed: p50 {cd['p50_ms']} ms, p99 {cd['p99_ms']} ms. "
            f"PreStartContainer (the pre-start a prepare also asks of the driver): p50 "
            f"{s['prestart']['p50_ms']} ms; (a)/((c)+prestart+(d)) "
            f"{both(a, sums['allocate+prestart+get'])}. The files a prepare writes (checkpoint twice, CDI "
            f"spec; unsynced), written by this process: p50 {s['files']['p50_ms']} ms, p99 "
            f"{s['files']['p99_ms']} ms; (a) over the sum of these parts measured apart "
            f"(Allocate, PreStartContainer, GET, files): {both(a, sums['allocate+prestart+get+files'])}. "
            f"CPU ms per call, {'/'.join(PROCESSES)}: {cpu_note} "
            f"(clock ticks of {TICK_S * 1000:g} ms summed over each arm's calls)."
        ),
        extra={
            "claims": count,
            "arms": s,
            "sums": sums,
            "cpu_ms_per_call": per_call,
        },
    )

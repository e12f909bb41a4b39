"""Row fleet: N nodes' DRA publishers against one real kube-apiserver and etcd (--nodes N,...).

Each simulated node is devshim's own publisher (shim.dra.publisher.PoolPublisher, the code a
node runs), with its own node name, its own API client (its own connection, as each node's
devshim has) and its own list and watch of its slices, eight devices each; all of them run in
this one process, the API server and etcd beside it (1.37, built on first use). Per N:

- start: from the publishers started until every node's pool is in the API server, and the
  requests that took per node (the API server's apiserver_request_total, before and after);
- a health change on every node at once: the requests each costs (health is not a slice's
  content, so the goal is no write; docs/dra.md);
- idle: the requests per node per hour over IDLE_S (each watch ends after kube.WATCH_TIMEOUT_S
  and is followed by one list of the node's own slices), and the API server's and etcd's CPU
  and RSS;
- the API server restarted: when each node's publisher made its first successful round after
  the stop (their spread: the publishers' backoff is jittered), how long after the new API
  server was ready the last one came back, and that no slice is lost or doubled; the failed
  rounds (each a warning in the log) at start and through the restart.

Then the same N of the Go drivers' publishers (judges/k8s-1.37/slicefleet: one controller of
k8s.io/dynamic-resource-allocation/resourceslice per node, as the kubeletplugin helper starts it,
each with its own client and connection) against a fresh API server and etcd, measured the same
way from outside: until every pool is in the API server, the requests per node at start, idle,
and in RESTART_WINDOW_S from the API server's return after a restart, the API server's and etcd's
CPU and RSS, and no pool lost or doubled. The bench's own lists of the pools are taken out of
the counts. A health change has no Go counterpart: the helper's slices carry no health either.

Goals (issue 47): at N = 1,000 all pools whole within 60 s of the API server's return; a health
change costs no request beyond the slices it changes; devshim costs the API server no more than
the Go publishers per node.
"""

from __future__ import annotations

import asyncio
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from loguru import logger

from bench.common import Result, percentile, workdir
from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases as upstream
from shim.dra.ownership import Offer
from shim.dra.publisher import PoolPublisher
from shim.dra.slices import PoolDevice
from shim.model import Device, Health

DRIVER = "fleet.example.com"
DEVICES = 8
IDLE_S = 60.0
WHOLE_GOAL_S = 60.0
RESTART_WINDOW_S = 20.0  # after the API server's return: the requests a restart costs
GO_PROGRAM = "slicefleet"  # judges/k8s-1.37/slicefleet
_REQUESTS = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$", re.M)


def _requests(plane: ControlPlane) -> dict[str, float]:
    """resourceslices requests the API server counted, by verb (its /metrics)."""
    text = plane.request("GET", "/metrics")  # Prometheus' text: not JSON, so given as a string
    assert isinstance(text, str), "the API server's /metrics answered JSON"
    found: dict[str, float] = {}
    for match in _REQUESTS.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if labels.get("resource") == "resourceslices":
            found[labels["verb"]] = found.get(labels["verb"], 0.0) + float(match["value"])
    return found


def _total(before: dict[str, float], after: dict[str, float]) -> float:
    return sum(after.values()) - sum(before.values())


def _usage(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far and RSS in MB of each of the control plane's processes."""
    figures = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        figures[f"{name}_cpu_s"] = (int(fields[11]) + int(fields[12])) / 100
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                figures[f"{name}_rss_mb"] = round(int(line.split()[1]) / 1024, 1)
    return figures


def _idle_usage(plane: ControlPlane, before: dict[str, float], idle_s: float) -> dict[str, float]:
    """The control plane's CPU per hour since ``before`` (``idle_s`` ago) and its RSS now."""
    figures = {}
    for key, value in _usage(plane.pids).items():
        if key.endswith("_cpu_s"):
            figures[key.replace("_cpu_s", "_idle_cpu_s_per_h")] = round(
                (value - before[key]) * 3600 / idle_s, 1
            )
        else:
            figures[key] = value
    return figures


class FleetNode:
    """One node's pool and publisher, with an API client of its own: kr8s hands out one client
    per set of arguments, so each node names its own copy of the kubeconfig (one client for all
    would hold every watch on one connection pool, and their writes would wait for it)."""

    def __init__(self, index: int, kubeconfig: Path, folder: Path) -> None:
        self.name = f"fleet-{index:04d}"
        self.devices = [Device(f"gpu-{i}") for i in range(DEVICES)]
        own = folder / f"{self.name}.kubeconfig"
        own.write_bytes(kubeconfig.read_bytes())
        self.publisher = PoolPublisher(DRIVER, self.name, self.offer, kubeconfig=own)
        self.task: asyncio.Task[None] | None = None

    def offer(self) -> Offer:
        return Offer([PoolDevice(d.id, d) for d in self.devices])

    def flip(self) -> None:
        first = self.devices[0]
        health = Health.UNHEALTHY if first.health == Health.HEALTHY else Health.HEALTHY
        self.devices[0] = replace(first, health=health)
        self.publisher.changed()


async def _until(check: Callable[[], bool], timeout: float, what: str) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.1)
    return time.monotonic() - began


def _pools(plane: ControlPlane, counted: _Counted | None = None) -> dict[str, int]:
    """The slices the API server holds, by node: one each when every pool is whole."""
    found: dict[str, int] = {}
    token = ""
    while True:
        if counted is not None:
            counted.lists += 1
        page = plane.request(
            "GET", f"/apis/resource.k8s.io/v1/resourceslices?limit=500&fieldSelector=spec.driver={DRIVER}"
            + (f"&continue={token}" if token else "")
        )  # fmt: skip
        for item in page.get("items") or []:
            node = item["spec"].get("nodeName", "")
            found[node] = found.get(node, 0) + 1
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return found


async def one_fleet(nodes: int, idle_s: float, window_s: float) -> dict[str, float]:
    figures: dict[str, float] = {"nodes": nodes}
    with workdir() as folder, ControlPlane(37, folder / "cp") as plane:
        failures: list[str] = []
        sink = logger.add(lambda m: failures.append(str(m)), level="WARNING", format="{message}")
        fleet = [FleetNode(i, plane.admin_kubeconfig, folder) for i in range(nodes)]
        before = _requests(plane)
        for node in fleet:
            node.task = asyncio.create_task(node.publisher.run())
        names = {n.name for n in fleet}
        figures["start_s"] = round(await _until(
            lambda: all(n.publisher.status.published_at for n in fleet), 600, "every pool published"
        ), 2)  # fmt: skip
        whole = _pools(plane)
        assert set(whole) == names and set(whole.values()) == {1}, "a pool is missing or doubled"
        settled = _requests(plane)
        figures["start_requests_per_node"] = round(_total(before, settled) / nodes, 2)

        rounds = {n.name: n.publisher.status.rounds for n in fleet}
        for node in fleet:
            node.flip()
        await _until(
            lambda: all(n.publisher.status.rounds > rounds[n.name] for n in fleet), 120, "every flip seen"
        )
        await asyncio.sleep(2)
        flipped = _requests(plane)
        figures["requests_per_health_change"] = round(_total(settled, flipped) / nodes, 2)

        usage = _usage(plane.pids)
        await asyncio.sleep(idle_s)
        idle = _requests(plane)
        figures["idle_requests_per_node_per_h"] = round(_total(flipped, idle) / nodes * 3600 / idle_s, 1)
        figures |= _idle_usage(plane, usage, idle_s)

        figures["start_failed_rounds"] = len(failures)
        failures.clear()
        rounds = {n.name: n.publisher.status.rounds for n in fleet}
        returned: dict[str, float] = {}
        server_back: list[float] = []  # seconds from the stop until the new API server was ready
        stopped = time.monotonic()  # the restart stops the API server at once, then starts it
        restarting = asyncio.create_task(asyncio.to_thread(plane.restart))

        def all_back() -> bool:
            if restarting.done() and not server_back:
                server_back.append(time.monotonic() - stopped)
            for n in fleet:
                if n.name not in returned and n.publisher.status.rounds > rounds[n.name]:
                    returned[n.name] = time.monotonic() - stopped
            return len(returned) == nodes and restarting.done()

        await _until(all_back, 600, "every publisher back")
        await restarting
        await asyncio.sleep(max(0.0, stopped + server_back[0] + window_s - time.monotonic()))
        # The new API server counts from zero: its whole tally is the restart's.
        figures["restart_requests_per_node"] = round(sum(_requests(plane).values()) / nodes, 2)
        spread = sorted(returned.values())
        whole = _pools(plane)
        restarting_s = server_back[0]
        figures["restart_server_back_s"] = round(restarting_s, 2)
        figures["restart_back_p50_s"] = round(statistics.median(spread), 2)
        figures["restart_back_p99_s"] = round(percentile(spread, 99), 2)
        figures["restart_whole_s"] = round(max(0.0, spread[-1] - restarting_s), 2)  # after its return
        figures["restart_failed_rounds"] = len(failures)
        logger.remove(sink)
        figures["restart_lost_or_doubled"] = sum(1 for n in names if whole.get(n) != 1) + len(
            set(whole) - names
        )
        for node in fleet:
            assert node.task is not None
            node.task.cancel()
        await asyncio.gather(*(n.task for n in fleet if n.task), return_exceptions=True)
    return figures


class _Counted:
    """The pools as the API server holds them, read by the bench, its own requests counted so
    that they can be taken out of the API server's tally."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane, self.lists = plane, 0

    def pools(self) -> dict[str, int]:
        return _pools(self.plane, self)

    def requests(self, before: dict[str, float]) -> float:
        """The resourceslices requests since ``before``, less the bench's own lists."""
        return _total(before, _requests(self.plane)) - self.lists


async def one_go_fleet(nodes: int, idle_s: float, window_s: float) -> dict[str, float]:
    """The same N of the Go drivers' publishers (slicefleet), measured from outside."""
    [release] = [r for r in upstream.releases() if r.minor == 37]
    program = await asyncio.to_thread(upstream.build, release, log=False, program=GO_PROGRAM)
    figures: dict[str, float] = {"nodes": nodes}
    with workdir() as folder, ControlPlane(37, folder / "cp") as plane:
        reader = _Counted(plane)
        names = {f"go-fleet-{i:04d}" for i in range(nodes)}
        log = (folder / "slicefleet.log").open("wb")
        before = _requests(plane)
        proc = subprocess.Popen(
            [str(program), "-kubeconfig", str(plane.admin_kubeconfig), "-nodes", str(nodes),
             "-devices", str(DEVICES), "-driver", DRIVER, "-prefix", "go-fleet-"],
            stdout=log, stderr=log,
        )  # fmt: skip
        try:

            def whole() -> bool:
                found = reader.pools()
                return set(found) == names and set(found.values()) == {1}

            figures["start_s"] = round(await _until(whole, 600, "every Go pool published"), 2)
            await asyncio.sleep(2)  # a write the last one made still in flight
            figures["start_requests_per_node"] = round(reader.requests(before) / nodes, 2)
            usage, reader.lists, settled = _usage(plane.pids), 0, _requests(plane)
            await asyncio.sleep(idle_s)
            idle_requests = reader.requests(settled)
            figures["idle_requests_per_node_per_h"] = round(idle_requests / nodes * 3600 / idle_s, 1)
            figures |= _idle_usage(plane, usage, idle_s)
            await asyncio.to_thread(plane.restart)
            await asyncio.sleep(window_s)
            reader.lists = 0  # the new API server counts from zero: its whole tally is the restart's
            figures["restart_requests_per_node"] = round(reader.requests({}) / nodes, 2)
            found = reader.pools()
            figures["restart_lost_or_doubled"] = sum(1 for n in names if found.get(n) != 1) + len(
                set(found) - names
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        figures["errors_logged"] = sum(1 for line in (folder / "slicefleet.log").read_text().splitlines()
                                       if not line.startswith("started"))  # fmt: skip
    return figures


async def fleet(quick: bool, sizes: tuple[int, ...] = (10, 100)) -> Result:
    idle_s, window_s = (5.0, 5.0) if quick else (IDLE_S, RESTART_WINDOW_S)
    logger.remove()  # a thousand publishers' lines; their warnings are counted (failed rounds)
    logger.add(sys.stderr, level="ERROR")
    runs = [await one_fleet(n, idle_s, window_s) for n in sizes]
    go = [await one_go_fleet(n, idle_s, window_s) for n in sizes]
    largest, anchor = runs[-1], go[-1]
    met = all(r["restart_whole_s"] <= WHOLE_GOAL_S and r["restart_lost_or_doubled"] == 0 for r in runs)
    met = met and all(r["requests_per_health_change"] == 0 for r in runs)
    per_node = ("start_requests_per_node", "restart_requests_per_node")
    met = met and all(r[k] <= g[k] for r, g in zip(runs, go, strict=True) for k in per_node)
    return Result(
        f"fleet: {', '.join(str(n) for n in sizes)} nodes' publishers against one kube-apiserver",
        {k: v for k, v in anchor.items() if not isinstance(v, str)},
        {k: v for k, v in largest.items() if not isinstance(v, str)},
        f"{int(largest['nodes'])} nodes: published in {largest['start_s']} s (Go {anchor['start_s']} s), "
        f"whole {largest['restart_whole_s']} s after a restart, "
        f"{largest['requests_per_health_change']} requests per health change; requests per node at "
        f"start {largest['start_requests_per_node']} (Go {anchor['start_requests_per_node']}), after "
        f"a restart {largest['restart_requests_per_node']} (Go {anchor['restart_requests_per_node']})",
        f"whole ≤ {WHOLE_GOAL_S:g} s after a restart, nothing lost, no request for a health change, "
        "requests per node ≤ the Go publishers'",
        met,
        note=f"idle {idle_s:g} s and {window_s:g} s after a restart per size; baseline: as many Go "
        "publishers (k8s.io/dynamic-resource-allocation/resourceslice, judges/k8s-1.37/slicefleet)",
        extra={str(int(r["nodes"])): r for r in runs} | {f"{int(g['nodes'])}-go": g for g in go},
    )

"""`devshim compat --dra`: the DRA scenarios (dra_scenarios.py) across pairs of a kubelet release
(its real DRA manager) and an API server release (a real kube-apiserver and etcd).

A pair is a column, chosen as KUBELET/APISERVER (`--dra-pair 1.33/1.33`). Pairs are those upstream supports,
the kubelet never newer than the API server nor more than three minors older, among the releases
devshim carries a DRA manager and an API server of. A 1.33 kubelet's newer API server serves
resource.k8s.io/v1beta1 too, as its operator must turn on (docs/dra.md, "From the device plugin
to DRA").
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shim.compat.dra_scenarios import SCENARIOS, DraCell, resource_versions, upgrade_target

__all__ = ["SCENARIOS", "choose_pairs", "pair_name", "requirements", "run_dra_matrix", "supported_pairs"]
from shim.compat.realnode.controlplane import ControlPlane, apiserver_releases
from shim.compat.results import Result, run_cell
from shim.compat.upstream import releases
from shim.compat.upstream.dra_manager import dra_releases

Pair = tuple[releases.Release, releases.Release]  # (kubelet, API server)
MAX_SKEW = 3  # a kubelet may be up to three minors older than its API server


def pair_name(pair: Pair) -> str:
    """The column's name, as the table stacks it: kubelet-1.33 over apiserver-1.33."""
    kubelet, server = pair
    return f"kubelet-1.{kubelet.minor}/apiserver-1.{server.minor}"


def _short(pair: Pair) -> str:
    kubelet, server = pair
    return f"1.{kubelet.minor}/1.{server.minor}"


def supported_pairs() -> list[Pair]:
    servers = apiserver_releases()
    return [(k, a) for k in dra_releases() for a in servers if k.minor <= a.minor <= k.minor + MAX_SKEW]


def choose_pairs(given: Sequence[str]) -> list[Pair]:
    """The pairs named (`1.33/1.33`, or `all`); by default the oldest and the newest release,
    each with its own API server. ValueError naming the choices for an unknown one."""
    pairs = supported_pairs()
    if not given:
        same = [p for p in pairs if p[0].minor == p[1].minor]
        return list(dict.fromkeys([same[0], same[-1]]))
    if "all" in given:
        return pairs
    by_name = {_short(p): p for p in pairs} | {pair_name(p): p for p in pairs}
    unknown = [g for g in given if g not in by_name]
    if unknown:
        choices = ", ".join(_short(p) for p in pairs)
        raise ValueError(f"unknown DRA pair {', '.join(unknown)}; choose from {choices}, or all")
    return [by_name[g] for g in dict.fromkeys(given)]


def requirements(pairs: Sequence[Pair]) -> str:
    """What the run needs, said before it starts (as the device-plugin judge says its own)."""
    kubelets = sorted({f"1.{k.minor}" for k, _ in pairs})
    carried = {a.minor for a in apiserver_releases()}
    # The upgrade row's target: the next minor, where carried.
    servers = sorted({f"1.{m}" for _, a in pairs for m in (a.minor, a.minor + 1) if m in carried})
    return (
        f"the DRA judge builds the DRA manager of {', '.join(kubelets)} and kube-apiserver and etcd "
        f"of {', '.join(servers)} with Go into the judge's cache on first use (minutes and about "
        "1 GiB of Go caches per release, cold; seconds once built); no root is needed"
    )


@dataclass(frozen=True)
class Column:
    """What a pair's cells share: its API server, running, and the kubelet release's DRA manager."""

    plane: ControlPlane
    kubelet: releases.Release
    manager_binary: Path


# One row in one cell: (row, its column, a fresh folder, a fresh node's name) -> what it saw.
RunRow = Callable[[str, Column, Path, str], Awaitable[str]]


async def run_pairs(
    pairs: Sequence[Pair],
    rows: Sequence[str],
    timeout_s: float,
    progress: Callable[[Result], None],
    run_row: RunRow,
) -> list[Result]:
    """Every (row, pair) cell: one API server per pair (serving what its kubelet reads claims
    through), a fresh folder and node per cell."""
    results: list[Result] = []
    nodes = itertools.count(1)
    for pair in pairs:
        kubelet, server = pair
        binary = await asyncio.to_thread(
            releases.build, kubelet, program=releases.DRAMANAGER_PROGRAM, log=False
        )
        # What a row builds for itself is built here, before any cell's clock starts: cold, the
        # upgrade's API server alone took a cell past its 90 s.
        if "apiserver_upgrade" in rows and (target := upgrade_target(server.minor, kubelet)) is not None:
            await asyncio.to_thread(releases.build, target, program=releases.APISERVER_PROGRAM, log=False)
        with tempfile.TemporaryDirectory(prefix="ds-dra-cp-", ignore_cleanup_errors=True) as plane_dir:
            also = resource_versions(kubelet, server.minor)
            plane = ControlPlane(server.minor, Path(plane_dir), resource_versions=also)
            await asyncio.to_thread(plane.start)
            try:
                column = Column(plane, kubelet, binary)
                for row in rows:
                    with tempfile.TemporaryDirectory(prefix="ds-dra-", ignore_cleanup_errors=True) as folder:
                        check = functools.partial(run_row, row, column, Path(folder), f"compat-{next(nodes)}")
                        result = await run_cell(row, pair_name(pair), check, timeout_s)
                    progress(result)
                    results.append(result)
            finally:
                await asyncio.to_thread(plane.stop)
    return results


async def run_dra_matrix(
    settings: dict[str, Any],
    driver: str,
    pairs: Sequence[Pair],
    scenarios: Sequence[str],
    timeout_s: float,
    progress: Callable[[Result], None],
    health_hook: str | None = None,
    hook_env: Mapping[str, str] | None = None,
) -> list[Result]:
    """devshim serving ``settings`` (its pool ``driver``) in every (scenario, pair) cell."""

    def run_row(row: str, column: Column, folder: Path, node: str) -> Awaitable[str]:
        cell = DraCell(
            column.plane, column.kubelet, column.manager_binary, settings, driver, folder, node,
            health_hook, hook_env or {},
        )  # fmt: skip
        return SCENARIOS[row](cell)

    return await run_pairs(pairs, scenarios, timeout_s, progress, run_row)

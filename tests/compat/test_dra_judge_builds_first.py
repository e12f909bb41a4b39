"""The DRA judge builds what a row needs before the row's clock starts (issue 42, item 6): on a
machine with cold caches the apiserver_upgrade row built the next API server inside its cell and
failed "the cell did not finish within 90 s", though it passed warm.

run_pairs with a real API server (1.33, whose upgrade target is 1.34), its builds observed as
they are made (each still the real build, from the warm cache here), and a row that notes when
its cell started.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shim.compat.dra_matrix import Column, choose_pairs, run_pairs
from shim.compat.results import Result
from shim.compat.upstream import releases
from tests.support.dra_judge import build


def test_the_upgrade_target_is_built_before_the_upgrade_rows_cell_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    [(kubelet, server)] = choose_pairs(["1.33/1.33"])
    build(kubelet)  # the pair's own programs: what any run builds first
    events: list[str] = []
    real_build = releases.build

    def observed(
        release: releases.Release, *, log: bool = True, program: str = releases.HARNESS_PROGRAM
    ) -> Path:
        events.append(f"build {program} {release.name}")
        return real_build(release, log=log, program=program)

    monkeypatch.setattr(releases, "build", observed)  # as dra_matrix calls it: releases.build

    async def row(name: str, column: Column, folder: Path, node: str) -> str:
        events.append(f"cell {name}")
        return "noted"

    results: list[Result] = asyncio.run(
        run_pairs([(kubelet, server)], ["apiserver_upgrade"], 60, lambda result: None, row)
    )
    assert [r.status.value for r in results] == ["pass"], results
    target = f"build {releases.APISERVER_PROGRAM} upstream-1.34"
    assert target in events and events.index(target) < events.index("cell apiserver_upgrade"), events

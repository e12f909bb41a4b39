"""Running the driver matrix with the upstream judge: every (scenario, release, registration)
cell in a fresh world (world.py) whose kubelet is that release's real device manager."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from shim.compat.driver_world import DriverUnderTest
from shim.compat.modes import REGISTRATIONS
from shim.compat.results import Result, run_cell

from .releases import Release
from .scenarios import LONG, REMOVAL_GRACE_S, SCENARIOS, first_release
from .world import judged_world

CELL_TIMEOUT_S = 120.0

Cell = tuple[str, Release, str]  # scenario, release, registration


def column(release: Release, registration: str) -> str:
    return f"{release.name}/{registration}"


def judged_cells(
    scenarios: Sequence[str] | None, releases: Sequence[Release], registrations: Sequence[str] | None = None
) -> list[Cell]:
    """The selected cells, scenario-major; by default every row but the LONG ones."""
    chosen = list(scenarios or (s for s in SCENARIOS if s not in LONG))
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    return [(s, r, g) for s in chosen for r in releases for g in (registrations or REGISTRATIONS)]


async def run_judged_cell(
    driver: DriverUnderTest,
    release: Release,
    registration: str,
    scenario: str,
    binaries: Mapping[Release, Path],
) -> None:
    first = first_release(scenario, release, list(binaries))
    async with judged_world(driver, release, registration, binaries, first) as world:
        await SCENARIOS[scenario](world)


async def run_judged_matrix(
    driver: DriverUnderTest,
    cells: Sequence[Cell],
    binaries: Mapping[Release, Path],
    *,
    timeout_s: float = CELL_TIMEOUT_S,
    progress: Callable[[Result], None] = lambda result: None,
) -> list[Result]:
    """Run `cells` one after another; a LONG row gets the manager's grace on top of `timeout_s`."""
    results = []
    for s, r, g in cells:
        check = functools.partial(run_judged_cell, driver, r, g, s, binaries)
        bound = timeout_s + (REMOVAL_GRACE_S if s in LONG else 0.0)
        result = await run_cell(s, column(r, g), check, bound)
        progress(result)
        results.append(result)
    return results

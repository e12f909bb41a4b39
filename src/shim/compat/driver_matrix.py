"""Running the driver matrix: every selected (scenario, mode) cell in a fresh world."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from .driver_scenarios import SCENARIOS, starts_one_step_up
from .driver_world import DriverUnderTest, driver_world
from .modes import MODES, Mode
from .results import Result, Skip, run_cells

CELL_TIMEOUT_S = 90.0


async def run_driver_cell(driver: DriverUnderTest, mode: Mode, scenario: str) -> str | None:
    """One cell: the scenario in a fresh world of the mode (Skip/Failed as the scenario raises)."""
    first = mode.kubelet
    if starts_one_step_up(scenario):
        if mode.newer is None:
            raise Skip("the newest kubelet modelled: nothing to downgrade from")
        first = mode.newer
    async with driver_world(driver, mode, first) as world:
        return await SCENARIOS[scenario](world)


async def run_driver_matrix(
    driver: DriverUnderTest,
    cells: Sequence[tuple[str, Mode]],
    *,
    timeout_s: float = CELL_TIMEOUT_S,
    progress: Callable[[Result], None] = lambda result: None,
) -> list[Result]:
    """Run `cells` (scenario, mode) one after another; a result per cell, in order."""
    runs = ((s, m.id, functools.partial(run_driver_cell, driver, m, s)) for s, m in cells)
    return await run_cells(runs, timeout_s, progress)


def driver_cells(
    scenarios: Sequence[str] | None = None, modes: Sequence[Mode] | None = None
) -> list[tuple[str, Mode]]:
    """The selected cells, scenario-major (all of them by default)."""
    chosen = list(scenarios or SCENARIOS)
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    return [(scenario, mode) for scenario in chosen for mode in (modes or MODES)]

"""The compatibility matrix as the project's own suite: the scenarios `devshim compat --driver` runs
(shim.compat), here against a driver that implements every optional method
(drivers/lifecycle.py). Every cell passes or skips for a stated reason; the ones that skip are
listed here, so a new skip fails the suite.

By default each v1beta1 kubelet runs every scenario on one registration path (alternating), with
pairwise coverage of the rest (in_ci_subset); `--full-matrix` runs all.
"""

from __future__ import annotations

import sys

import pytest

from shim.compat.driver_matrix import run_driver_cell
from shim.compat.driver_scenarios import SCENARIOS
from shim.compat.driver_world import DriverUnderTest, driver_world, ids, restart_kubelet
from shim.compat.modes import KUBELET_LINE, MODES, REGISTRATIONS, Mode, in_default_subset
from shim.compat.results import Skip
from tests.support import AS_ROOT, DRIVERS

LIFECYCLE = DriverUnderTest(
    [sys.executable, str(DRIVERS / "lifecycle.py")],
    entry=AS_ROOT,
    health_hook='kill -USR1 "$DEVSHIM_COMPAT_DRIVER_PID"',  # it flips its last device
)


def expected_skip(scenario: str, mode: Mode) -> str | None:
    """The cells that cannot apply to the lifecycle driver, and why."""
    if scenario == "post_stop" and mode.kubelet.negotiated == "v1beta1":
        return "v1beta1 has no PostStopContainer"
    if scenario in ("upgrade", "downgrade") and mode.newer is None:
        return "the newest kubelet modelled"
    if scenario == "health_watch":
        return "give --health-watch SECONDS"
    return None


def in_ci_subset(mode: Mode, scenario_index: int) -> bool:
    """`devshim compat --quick`'s cells, but one registration path per v1beta1 kubelet and
    scenario, alternating (for the default suite's time): every (scenario, kubelet), (scenario,
    path) and (kubelet, path) pair still runs. Both paths of every scenario run against the newest
    real device manager in test_upstream_judge.py."""
    if not in_default_subset(mode, scenario_index):
        return False
    if mode.kubelet.speaks != "v1beta1":
        return True
    turn = scenario_index + KUBELET_LINE.index(mode.kubelet)
    return mode.registration == REGISTRATIONS[turn % 2]


def params() -> list[object]:
    return [
        pytest.param(
            scenario,
            mode,
            id=f"{scenario}-{mode.id.replace('/', '-')}",
            marks=[] if in_ci_subset(mode, i) else [pytest.mark.full_matrix],
        )
        for i, scenario in enumerate(SCENARIOS)
        for mode in MODES
    ]


@pytest.mark.parametrize(("scenario", "mode"), params())
async def test_matrix_cell(scenario: str, mode: Mode) -> None:
    """One cell, exactly as `devshim compat` runs it: it passes, or skips for the expected reason."""
    expected = expected_skip(scenario, mode)
    try:
        await run_driver_cell(LIFECYCLE, mode, scenario)
    except Skip as skip:
        assert expected is not None and expected in str(skip), f"unexpected skip: {skip}"
        pytest.skip(str(skip))
    assert expected is None, f"expected a skip ({expected}), but the cell ran and passed"


@pytest.mark.parametrize("registration", ["classic", "watcher"])
async def test_a_restart_loop_up_and_down_the_kubelet_line_loses_no_device(registration: str) -> None:
    """1.24 -> ... -> next speaking v1beta2 and back down, in one world: after every restart devshim
    is registered with the version the kubelet speaks, every list holds every device, allocation
    works, and the driver is never restarted."""
    mode = Mode(KUBELET_LINE[0], registration)
    line = [*KUBELET_LINE[1:], *reversed(KUBELET_LINE[:-1])]
    async with driver_world(LIFECYCLE, mode) as w:
        pid = w.driver_pid()
        for n, kubelet in enumerate(line, start=2):
            await restart_kubelet(w, kubelet)
            session = await w.registered("example.com/life", count=n)
            assert all(ids(listed) == ["l-0", "l-1", "l-2", "l-3"] for listed in session.lists), kubelet
            assert (await session.allocate(["l-0"])).envs == {"LIFE": "l-0"}
        assert w.driver_pid() == pid


THREE_RESOURCES = DriverUnderTest(
    [sys.executable, "-m", "devshim_adapters.sim", "--config-json",
     '{"resources": [{"name": "example.com/one", "count": 2}, {"name": "example.com/two", "count": 2},'
     ' {"name": "example.com/three", "count": 2}]}'],
    entry=AS_ROOT,
)  # fmt: skip


@pytest.mark.parametrize(
    "scenario", ["list_watch", "allocate", "kubelet_restart", "socket_removed", "driver_crash"]
)
async def test_scenarios_check_every_resource_of_a_driver_that_serves_several(scenario: str) -> None:
    """A driver crash or a restart touches every resource at once: each must be checked on its own
    lists (the crash's outage list of the last resource is history by the time it is looked at)."""
    await run_driver_cell(THREE_RESOURCES, Mode(KUBELET_LINE[2], "classic"), scenario)

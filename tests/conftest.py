"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from shim.compat.fakekubelet import FakeKubelet
from shim.ops import metrics
from tests.support.shim_fixtures import logged
from tests.support.unix import short_temp_dir

# Every devshim a test starts picks a free port for its ops endpoint, never the default 9477
# (a test that needs a known port sets DEVSHIM_HTTP__PORT itself).
os.environ["DEVSHIM_HTTP__PORT"] = "0"
# Tests read devshim's series in-process (from shim.ops.series) from Shims they start themselves,
# where `devshim run` enables them only with its ops endpoint on.
metrics.enable()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A fresh device-plugins directory with a short path (unix sockets go in it)."""
    with short_temp_dir("ds-") as path:
        yield path


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """devshim's own state directory for one test (never the real /var/lib/devshim)."""
    with short_temp_dir("ds-state-") as path:
        yield path


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[FakeKubelet]:
    """The fake kubelet with its defaults (newest profile, v1beta1), serving in plugin_dir for the
    whole test. A test that needs options, or starts it part-way through, opens its own."""
    async with FakeKubelet(plugin_dir) as kubelet:
        yield kubelet


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """The messages of devshim's WARNING (and worse) log lines while the test runs."""
    with logged("WARNING") as messages:
        yield messages


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full-matrix",
        action="store_true",
        help="run every cell of the compatibility matrix (test_matrix.py), not the default subset",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--full-matrix"):
        return
    skip = pytest.mark.skip(reason="outside the default matrix subset; run with --full-matrix")
    for item in items:
        if "full_matrix" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say how many compatibility-matrix cells ran, were skipped, and why."""
    outcomes: dict[str, int] = {}
    for outcome in ("passed", "failed", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            if "test_matrix_cell" in report.nodeid and (report.when == "call" or outcome == "skipped"):
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
    if outcomes:
        terminalreporter.write_line(
            "compat matrix: "
            + ", ".join(f"{n} cells {outcome}" for outcome, n in sorted(outcomes.items()))
            + (
                " (full matrix)"
                if config.getoption("--full-matrix")
                else " (default subset; --full-matrix for all)"
            )
        )

"""compat's health_watch row: a health change the driver makes on its own, not through a hook.

Cells end in about a second, so a driver whose device fails by itself later was never seen
changing. The row waits (--health-watch SECONDS) and then holds the kubelet's view to what the
driver itself lists: a change the driver made but never told devshim of fails it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.support import DRIVERS
from tests.support.compat_cell import Cell, run_cell


def health_watch(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Cell:
    settings = tmp_path / "devshim.yaml"
    entry = {
        "name": "flipping",
        "user": "root",
        "command": [sys.executable, str(DRIVERS / "flipping.py")],
        "env": env or {},
        "resources": ["example.com/flip"],
    }
    settings.write_text(yaml.safe_dump({"drivers": [entry]}))
    return run_cell(tmp_path, "health_watch", "--config", str(settings), *args)


def test_a_change_the_driver_makes_and_notifies_passes_showing_it(tmp_path: Path) -> None:
    cell = health_watch(tmp_path, "--health-watch", "20")
    assert (cell.code, cell.status) == (0, "pass"), cell
    # Plain text, never the repr of a list of tuples (issue 45).
    assert cell.reason.startswith("example.com/flip: f-1 Unhealthy after "), cell.reason


def test_a_change_the_driver_never_notifies_fails_naming_both_views(tmp_path: Path) -> None:
    cell = health_watch(tmp_path, "--health-watch", "3", env={"FLIP_SILENTLY": "1"})
    assert (cell.code, cell.status) == (1, "fail"), cell
    assert cell.reason.startswith(
        "example.com/flip: the driver lists f-0 Healthy, f-1 Unhealthy; "
        "the kubelet still has f-0 Healthy, f-1 Healthy (was the change notified"
    ), cell.reason


def test_without_a_watch_time_the_row_is_skipped_saying_how_to_ask_for_it(tmp_path: Path) -> None:
    cell = health_watch(tmp_path)
    assert (cell.code, cell.status) == (0, "skip")
    assert cell.reason == "give --health-watch SECONDS to wait for health changes the driver makes on its own"

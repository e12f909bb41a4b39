"""`python -m bench` still runs: cheap rows, --quick; checks the JSON's shape, never its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.toolchains import toolchain

ROOT = Path(__file__).parent.parent
FIELDS = {"name", "baseline", "devshim", "value", "goal", "met", "by", "note", "extra"}


def test_quick_row_writes_every_field(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [sys.executable, "-m", "bench", "--quick", "--rows", "reregister", "--json", str(out)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["quick"] is True
    (row,) = document["rows"]
    assert set(row) == FIELDS
    assert row["extra"]["row"] == "reregister"
    assert row["met"] in (True, False), row["note"]
    assert {"p50_ms", "p99_ms"} <= set(row["devshim"]) and {"p50_ms", "p99_ms"} <= set(row["baseline"])
    assert "| kubelet restart" in done.stdout


def test_the_go_client_row_times_the_native_plugin_and_devshims_three_paths(tmp_path: Path) -> None:
    """Row goclient builds its Go client and goplug (cached by source hash, seconds with Go's
    caches warm) and times Allocate against all four targets; its shape, never its figures."""
    toolchain("go", "the goclient benchmark row (bench/goclient)")
    out = tmp_path / "bench.json"
    args = [sys.executable, "-m", "bench", "--quick", "--rows", "goclient", "--json", str(out)]
    # Under pytest-timeout's 120 s; goplug's build with Go's caches cold is 27 s (docs/toolchains.md).
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["met"] is None and not row["note"].startswith("failed"), row["note"]
    targets = row["extra"]["targets"]
    assert set(targets) == {"native", "static", "sim", "legacy"}
    assert {t["n"] for t in targets.values()} == {400}


def test_the_sdk_rows_measure_a_go_driver_beside_a_python_one(tmp_path: Path) -> None:
    """Rows sdk_rss and sdk_allocate in one run: the Go drivers built (cached by source, a second
    with Go's caches warm), each driver's RSS and Allocate through devshim; the shape, and that
    each figure was measured (a driver that never answered fails the row), never how fast."""
    toolchain("go", "the Go SDK rows (sdk_rss, sdk_allocate)")
    out = tmp_path / "bench.json"
    args = [sys.executable, "-m", "bench", "--quick", "--rows", "sdk_rss,sdk_allocate", "--json", str(out)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    rss, allocate = json.loads(out.read_text())["rows"]
    assert rss["met"] in (True, False) and allocate["met"] in (True, False), (rss["note"], allocate["note"])
    assert set(rss["devshim"]) == {"go_fpga_mb", "go_fans_mb"}
    assert set(rss["baseline"]) == {"empty_go_mb", "python_fans_mb"}
    assert all(mb > 0 for mb in [*rss["devshim"].values(), *rss["baseline"].values()])
    assert {arm["n"] for arm in (allocate["extra"]["go"], allocate["extra"]["python"])} == {300}
    assert set(allocate["extra"]["driver_cpu_us_per_call"]) == {"go", "python"}
    assert "| idle RSS: a Go SDK driver" in done.stdout and "Go/Python p50" in done.stdout


@pytest.mark.timeout(240)  # two control planes, each restarted once
def test_the_fleet_row_publishes_every_pool_and_finds_them_whole_after_a_restart(tmp_path: Path) -> None:
    """Row fleet with three nodes, --quick: the control plane and the Go publishers (built and
    cached by the suite's prebuild), every pool published, a health change, the API server
    restarted, for devshim's publishers and then as many Go ones; the shape, and that nothing
    was lost, never how fast."""
    toolchain("go", "the fleet row's kube-apiserver")
    out = tmp_path / "bench.json"
    args = [sys.executable, "-m", "bench", "--quick", "--rows", "fleet", "--nodes", "3", "--json", str(out)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert not row["note"].startswith("failed"), row["note"]
    figures, go = row["extra"]["3"], row["extra"]["3-go"]
    assert figures["nodes"] == 3 and figures["restart_lost_or_doubled"] == 0
    assert figures["start_requests_per_node"] > 0 and figures["start_s"] > 0
    assert go["nodes"] == 3 and go["restart_lost_or_doubled"] == 0 and go["start_requests_per_node"] > 0

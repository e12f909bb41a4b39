"""`devshim compat --driver` as a real process: real drivers pass, each bug of drivers/broken.py fails
exactly the rows it should, and the table, JSON and JUnit agree. (Drivers with several resources:
test_matrix.py.)
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from shim.compat.driver_scenarios import SCENARIOS
from tests.support import DRIVERS
from tests.support.compat_run import compat, table_row
from tests.support.devshim_process import DEVSHIM

PYTHON = shlex.quote(sys.executable)
WATCH_NOT_ASKED = "give --health-watch SECONDS to wait for health changes the driver makes on its own"
BROKEN = DRIVERS / "broken.py"
SIGUSR1_HOOK = 'kill -USR1 "$DEVSHIM_COMPAT_DRIVER_PID"'
NEWEST = "the newest kubelet modelled"


def test_the_simulator_passes_every_quick_classic_cell_of_the_next_kubelet(tmp_path: Path) -> None:
    """The simulator with every optional method, its health flipped through its control file:
    exit 0, no failed cell, and the only skips are the cells the scenarios state: no
    PostStopContainer in v1beta1, no newer kubelet than next/v1beta2. Classic registration only,
    for time (devfs covers the watcher)."""
    control = tmp_path / "control"
    control.touch()
    config = tmp_path / "sim.json"
    resource = {"name": "example.com/simulated", "count": 4}
    resource |= dict.fromkeys(("preferred_allocation", "prestart", "deallocate", "post_stop"), True)
    config.write_text(json.dumps({"resources": [resource], "control_file": str(control)}))
    hook = f'echo "health $DEVSHIM_COMPAT_RESOURCE $DEVSHIM_COMPAT_DEVICE Unhealthy" >> {control}'
    driver = f"{PYTHON} -m devshim_adapters.sim --config {config}"
    args = ("--health-hook", hook, "--profile", "next", "--quick", "--registration", "classic")
    run = compat(tmp_path, "--driver", driver, "--driver-user", "root", *args)
    assert run.code == 0, run.stdout
    assert run.by_status("fail") == {}
    # --quick: every v1beta1 cell; each scenario once with `both` and once with `v1beta2`, the
    # registration alternating, so one of the two is classic.
    assert len(run.cells) == 2 * len(SCENARIOS)
    v1beta1 = {c["scenario"] for c in run.cells if c["mode"] == "next/v1beta1/classic"}
    newer = [c["scenario"] for c in run.cells if c["mode"] in ("next/both/classic", "next/v1beta2/classic")]
    assert v1beta1 == set(SCENARIOS)
    assert sorted(newer) == sorted(SCENARIOS)
    expected = {("post_stop", "next/v1beta1/classic"): "v1beta1 has no PostStopContainer"}
    for mode in {c["mode"] for c in run.cells if c["scenario"] == "health_watch"}:
        expected["health_watch", mode] = WATCH_NOT_ASKED
    for scenario, what in (("upgrade", "upgrade to"), ("downgrade", "downgrade from")):
        if (scenario, "next/v1beta2/classic") in {(c["scenario"], c["mode"]) for c in run.cells}:
            expected[scenario, "next/v1beta2/classic"] = f"{NEWEST}: nothing to {what}"
    assert run.by_status("skip") == expected
    assert "FAIL" not in run.stdout
    assert "health_change" in run.stdout and "cells for driver" in run.stderr


@pytest.mark.full_matrix  # 11.5 s of the default suite's 15 minutes; devfs runs at 1.37 by default
def test_devfs_passes_on_a_1_33_kubelet_through_the_plugin_watcher(tmp_path: Path) -> None:
    """devfs over a temp dir of fake nodes, devshim configured by --config: exit 0, no failed
    cell. It has no clean health hook (a node removed while not in use leaves the list instead of
    turning Unhealthy, so health_change would fail), so that row skips, as do the two methods
    devfs does not declare. (One registration path, for the default suite's time: classic
    registration is the sim's below and every driver's in test_upstream_judge.py.)"""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("ttyUSB0", "ttyUSB1", "ttyUSB2"):
        (dev / name).touch()
    config = tmp_path / "devfs.json"
    group = {"resource": "example.com/devfs-serial", "paths": [str(dev / "ttyUSB*")]}
    config.write_text(json.dumps({"groups": [group], "poll_interval_s": 0.2}))
    # As an operator would run it: the resource it serves declared, and the nodes here, regular
    # files in a temp dir (below /tmp) that a policy allows only when told so, allowed for it.
    policy = {
        "device_nodes": [str(dev / "ttyUSB*")],
        "device_node_types": None,
        "allow_world_writable_dirs": True,
    }
    command = [sys.executable, "-m", "devshim_adapters.devfs", "--config", str(config)]
    driver = {
        "name": "devfs",
        "user": "root",
        "command": command,
        "resources": [group["resource"]],
        "policy": policy,
    }
    settings = tmp_path / "devshim.yaml"
    settings.write_text(json.dumps({"drivers": [driver]}))
    run = compat(tmp_path, "--config", str(settings), "--profile", "1.33+", "--registration", "watcher")
    assert run.code == 0, run.stdout
    assert run.by_status("fail") == {}
    modes = ("1.33+/v1beta1/watcher",)
    assert sorted((c["scenario"], c["mode"]) for c in run.cells) == sorted(
        (s, m) for s in SCENARIOS for m in modes
    )
    reasons = {
        "health_change": "no --health-hook given: devshim cannot make a driver report a health change",
        "health_watch": WATCH_NOT_ASKED,
        "preferred_allocation": "the driver declares no resource with preferred allocation",
        "post_stop": "the driver declares no resource with post-stop",
    }
    assert run.by_status("skip") == {(s, m): why for s, why in reasons.items() for m in modes}


# bug -> (the rows it fails, what each failure's reason must say, the rows run: None for all). A
# pod that cannot start or end cleanly fails every row that runs one: admit/run_pod allocate and
# pre-start (devshim_restart starts one), end_pod post-stops and then deallocates
# (src/shim/compat/fakekubelet/pods.py). For time, the
# bugs after the first run only the rows that call the driver's optional methods, which no other
# row does, plus register as a control; forgetting after a restart, the restarts and two controls.
POD_ROWS = ("register", "allocate", "preferred_allocation", "prestart", "deallocate", "post_stop")
BUGS: dict[str, tuple[set[str], str, tuple[str, ...] | None]] = {
    "allocate-fails": (
        {"allocate", "prestart", "deallocate", "post_stop", "devshim_restart"},
        "allocate: broken driver: allocate fails on purpose",
        None,
    ),
    "prestart-fails": (
        {"prestart", "deallocate", "post_stop"},
        "prestart: broken driver: prestart fails",
        POD_ROWS,
    ),
    "deallocate-fails": (
        {"deallocate", "post_stop"},
        "deallocate: broken driver: deallocate fails",
        POD_ROWS,
    ),
    "post-stop-fails": ({"deallocate", "post_stop"}, "post_stop: broken driver: post_stop fails", POD_ROWS),
    "forgets-after-restart": (
        {"driver_crash"},
        "example.com/broken: not back to",
        ("register", "allocate", "kubelet_restart", "driver_crash"),
    ),
}


# forgets-after-restart waits out compat's 15 s recovery bound (17 s of the default suite's 15
# minutes): with --full-matrix; devshim's own restarts are searched by test_converge_stateful.py.
SLOW_BUGS = {"forgets-after-restart"}


@pytest.mark.parametrize(
    "bug", [pytest.param(b, marks=[pytest.mark.full_matrix] if b in SLOW_BUGS else []) for b in BUGS]
)
def test_each_bug_fails_exactly_its_rows(tmp_path: Path, bug: str) -> None:
    """One mode (next, both versions, classic): exit 1, the failed rows are exactly the bug's, each
    saying why, in the JSON and the table; every other row run passes."""
    rows, because, selected = BUGS[bug]
    driver = f"{PYTHON} {BROKEN} {bug} --state-dir {tmp_path}"
    args = ["--health-hook", SIGUSR1_HOOK, "--profile=next", "--kubelet=both", "--registration=classic"]
    chosen = list(selected or SCENARIOS)
    run = compat(
        tmp_path,
        "--driver",
        driver,
        "--driver-user",
        "root",
        *args,
        *(f"--scenario={s}" for s in selected or ()),
    )
    assert run.code == 1, run.stdout
    assert [c["scenario"] for c in run.cells] == chosen
    failed = run.by_status("fail")
    assert {scenario for scenario, _ in failed} == rows
    for (scenario, _), reason in failed.items():
        assert because in reason, f"{scenario}: {reason}"
        assert table_row(run.stdout, scenario).split()[1] == "FAIL"
    if bug == "forgets-after-restart":
        assert "('b-3', 'Healthy')" in failed["driver_crash", "next/both/classic"]
    # health_watch skips without --health-watch; every other row that does not fail passes.
    assert {c["scenario"] for c in run.cells if c["status"] == "pass"} == set(chosen) - rows - {
        "health_watch"
    }
    assert not list(tmp_path.glob("broken-*.running")), "a cleanly stopped driver leaves no marker"
    for scenario, _ in failed:
        assert repeat_command(driver, scenario) in run.stdout.splitlines()


def repeat_command(driver: str, scenario: str) -> str:
    """What `devshim compat` prints to repeat one failed cell of test_each_bug_fails_exactly_its_rows."""
    return "  " + shlex.join([
        "devshim", "compat", "--driver", driver, "--health-hook", SIGUSR1_HOOK, "--driver-user", "root",
        "--scenario", scenario,
        "--profile", "next", "--kubelet", "both", "--registration", "classic",
    ])  # fmt: skip


def test_a_failed_cells_repeat_command_runs_just_that_cell(tmp_path: Path) -> None:
    """The printed command, run as it is, runs the one cell again and fails it the same way."""
    driver = f"{PYTHON} {BROKEN} prestart-fails --state-dir {tmp_path}"
    argv = shlex.split(repeat_command(driver, "prestart").strip())
    assert argv[:2] == ["devshim", "compat"]
    run = compat(tmp_path, *argv[2:])
    assert run.code == 1
    cells = [(c["scenario"], c["mode"], c["status"]) for c in run.cells]
    assert cells == [("prestart", "next/both/classic", "fail")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param([], "give exactly one of --driver, --plugin and --socket", id="nothing-to-test"),
        pytest.param(
            ["--driver", "true", "--profile", "1.99"],
            "unknown profile 1.99; choose from 1.24, 1.25-1.32, 1.33+, next",
            id="unknown-profile",
        ),
        pytest.param(
            ["--driver", "true", "--judge", "upstream-1.99"],
            "unknown judge 'upstream-1.99'; choose from upstream, upstream-1.30, upstream-1.32, "
            "upstream-1.33, upstream-1.34, upstream-1.36, upstream-1.37",
            id="unknown-judge",
        ),
        pytest.param(
            ["--driver", "true", "--judge", "upstream", "--profile", "1.33+"],
            "--profile, --kubelet and --quick select the model's cells; with --judge, choose releases by "
            "--judge and paths by --registration",
            id="judge-and-profile",
        ),
        pytest.param(
            ["--driver", "true", "--prebuild"],
            "--prebuild builds the upstream judge: give --judge too",
            id="prebuild-without-judge",
        ),
        pytest.param(
            ["--socket", "/nonexistent.sock", "--judge", "upstream-1.37"],
            "--judge runs the plugin itself: give --plugin or --driver, not --socket",
            id="judge-with-socket",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], message: str) -> None:
    """Flags that make no run are refused before any cell: exit 2, one line naming the fix."""
    result = subprocess.run([*DEVSHIM, "compat", *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"devshim compat: {message}"]
    assert result.stdout == ""


def test_the_judge_without_root_exits_2_before_touching_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As another user the judge cannot make its mount namespaces: one line saying so, before it
    looks at the cache or Go (a user who cannot read root's cache got a traceback)."""
    from shim.compat import command

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    request = command.Request(driver="true", selection=command.Selection(judges=["upstream-1.37"]))
    with pytest.raises(command.UsageError, match="^the upstream judge needs root: the kubelet"):
        command.run(request)
    assert capsys.readouterr().err == ""

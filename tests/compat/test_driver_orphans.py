"""What a driver leaves behind: its orphans come to devshim (as PID 1 in its container, or as a
child subreaper), which reaps those that exit and kills those still running when it leaves
(shim/driverhost/reaper.py). Real `devshim run` processes; the driver is the flaky SDK driver
starting a child each run and exiting on SIGUSR1."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from shim.compat.fakekubelet import FakeKubelet
from tests.support import DRIVERS
from tests.support.devshim_process import DEVSHIM, children

RESTARTS = 5
WAIT_S = 30.0


def _config(tmp_path: Path, plugin_dir: Path, state_dir: Path, run_file: Path, child: str) -> Path:
    driver: dict[str, Any] = {
        "name": "flaky",
        "user": "root", "command": [sys.executable, str(DRIVERS / "flaky.py")],
        "env": {"RUN_FILE": str(run_file), "FLAKY_MISBEHAVE": "exit_on_signal", "FLAKY_BAD_RUNS": "all",
                "FLAKY_CHILD": child},
        "resources": ["example.com/flaky"],
        "restart": {"backoff_initial_s": 0.05, "backoff_max_s": 0.2, "max_start_failures": 100},
    }  # fmt: skip
    config = tmp_path / "devshim.json"
    settings = {"device_plugins_dir": str(plugin_dir), "state_dir": str(state_dir), "drivers": [driver]}
    config.write_text(json.dumps({**settings, "http": {"enabled": False}}))
    return config


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _zombies_of(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            status = _status(int(entry.name))
            if status.get("PPid") == str(parent) and status.get("State", "").startswith("Z"):
                found.append(int(entry.name))
    return found


def _driver(devshim_pid: int) -> int | None:
    for pid in children(devshim_pid):
        if b"flaky.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


async def _until(condition: Any, what: str) -> Any:
    async with asyncio.timeout(WAIT_S):
        while not (value := condition()):
            await asyncio.sleep(0.05)
    return value


def _starts(run_file: Path) -> int:
    return run_file.read_text().split().count("start") if run_file.exists() else 0


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
async def test_as_pid_1_devshim_reaps_the_children_restarted_drivers_leave(
    tmp_path: Path, plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """devshim is PID 1 of a PID namespace, as in its image. Each of five driver runs starts a
    child and exits; the group kill ends the child, which, orphaned, becomes devshim's. None is
    left a zombie (before: one more per restart)."""
    run_file = tmp_path / "runs"
    config = _config(tmp_path, plugin_dir, state_dir, run_file, child="1")
    # --kill-child: should the test fail, devshim dies with unshare (which forwards no signal).
    unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--"]
    holder = await asyncio.create_subprocess_exec(
        *unshare, *DEVSHIM, "run", "--config", str(config), stderr=asyncio.subprocess.DEVNULL
    )
    devshim = 0
    try:
        devshim = await _until(lambda: next(iter(children(holder.pid)), None), "devshim started")
        await kubelet.wait_for_plugin("example.com/flaky", timeout=WAIT_S)
        for run in range(1, RESTARTS + 1):
            driver = await _until(lambda: _starts(run_file) == run and _driver(devshim), f"run {run}")  # noqa: B023
            os.kill(driver, signal.SIGUSR1)
            await _until(lambda: _starts(run_file) > run, f"run {run + 1}")  # noqa: B023
        await _until(lambda: not _zombies_of(devshim) and _driver(devshim), "no zombies under devshim")
        assert not _zombies_of(devshim)
    finally:
        if devshim:
            os.kill(devshim, signal.SIGTERM)
        else:
            holder.kill()
        await holder.wait()
    assert holder.returncode == 0  # devshim left cleanly


async def test_a_daemon_a_driver_left_becomes_devshims_and_ends_with_it(
    tmp_path: Path, plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """A driver starts a child in a session of its own (a daemon: the group kill misses it) and
    exits. devshim, a child subreaper, adopts it (before: the node's init did, and it ran on after
    devshim), and kills it when devshim leaves."""
    run_file = tmp_path / "runs"
    config = _config(tmp_path, plugin_dir, state_dir, run_file, child="daemon")
    devshim = await asyncio.create_subprocess_exec(*DEVSHIM, "run", "--config", str(config),
                                                   stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    try:
        await kubelet.wait_for_plugin("example.com/flaky", timeout=WAIT_S)
        driver = await _until(lambda: _driver(devshim.pid), "the driver")
        daemon = int(run_file.read_text().split()[run_file.read_text().split().index("child") + 1])
        os.kill(driver, signal.SIGUSR1)
        await _until(lambda: _starts(run_file) == 2, "the driver restarted")
        assert _status(daemon).get("PPid") == str(devshim.pid)  # adopted, still running
        assert not _status(daemon)["State"].startswith("Z")
    finally:
        devshim.send_signal(signal.SIGTERM)
        await devshim.wait()
    assert devshim.returncode == 0
    assert not _status(daemon) or _status(daemon)["State"].startswith("Z"), _status(daemon)

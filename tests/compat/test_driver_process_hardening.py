"""Driver processes, hardened: the configured user, group and environment and nothing more, a
clear failure where devshim may not switch users, a death signal that survives the switch, and
a stderr that is read to the end however much the driver writes, yet reaches the log bounded.

The driver is tests/support/drivers/hardened.py, a real subprocess whose device IDs say what it
saw of itself (uid, gid, groups, environment names), so the fake kubelet's list proves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from loguru import logger

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.settings import Settings
from tests.support import AS_ROOT
from tests.support.privileges import HARDENED, NOBODY, NOBODY_PYTHON, can_drop_capabilities, needs_nobody

WHO = "example.com/who"
# devshim's supplementary groups, as the driver writes them: kept only by user: root.
OWN_GROUPS = "_".join(str(g) for g in sorted(os.getgroups()))
WAIT_S = 20.0


def driver(python: str | None = None, **settings: Any) -> dict[str, Any]:
    """The hardened driver's entry; as root unless ``settings`` name its user (AS_ROOT)."""
    return {
        "name": "hardened",
        "command": [python or sys.executable, str(HARDENED)],
        "resources": [WHO],
        "policy": {"envs": ["WHO"]},
        **AS_ROOT,
        **settings,
    }


@asynccontextmanager
async def serving(plugin_dir: Path, state_dir: Path, **driver_settings: Any) -> AsyncIterator[PluginSession]:
    """devshim with the hardened driver, and the kubelet's session of its resource."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        drivers=[driver(**driver_settings)],
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings):
        yield await kubelet.wait_for_plugin(WHO, timeout=WAIT_S)


async def driver_ids(session: PluginSession) -> list[str]:
    return [d.id for d in await session.wait_for_list(timeout=WAIT_S)]


@pytest.fixture
def log() -> Iterator[list[tuple[str, str]]]:
    """What devshim logged of drivers' stderr during the test: (level, message) pairs."""
    entries: list[tuple[str, str]] = []

    def sink(message: Any) -> None:
        if message.record["function"] == "_log_stderr":
            entries.append((message.record["level"].name, message.record["message"]))

    sink_id = logger.add(sink, level="INFO")
    try:
        yield entries
    finally:
        logger.remove(sink_id)


# --- who the driver runs as ------------------------------------------------------------------


@needs_nobody
@pytest.mark.parametrize(
    ("user", "group", "expected"),
    [
        pytest.param(None, None, ["uid-65534", "gid-65534", "groups-65534"], id="default"),
        pytest.param("nobody", None, ["uid-65534", "gid-65534", "groups-65534"], id="user"),
        pytest.param(NOBODY, 4242, ["uid-65534", "gid-4242", "groups-4242"], id="user-and-group"),
        pytest.param(None, "4242", ["uid-65534", "gid-4242", "groups-4242"], id="group-only"),
        pytest.param("root", "4242", ["uid-0", "gid-4242", "groups-4242"], id="root-and-group"),
        pytest.param("root", None, ["uid-0", "gid-0", f"groups-{OWN_GROUPS}"], id="root"),
    ],
)
async def test_a_driver_runs_as_the_configured_user_and_group_and_no_other_groups(
    plugin_dir: Path, state_dir: Path, user: str | int | None, group: str | int | None, expected: list[str]
) -> None:
    """The driver's real ids are the configured ones, and without a user nobody's (devshim runs
    as root here); its supplementary groups are the user's own from the group database (nobody
    has none beyond its group) and none of devshim's: a group switch drops root's group 0 too.
    Only ``user: root`` keeps devshim's ids."""
    async with serving(plugin_dir, state_dir, python=NOBODY_PYTHON, user=user, group=group) as session:
        assert (await driver_ids(session))[:3] == expected


async def test_a_driver_gets_exactly_its_configured_environment(plugin_dir: Path, state_dir: Path) -> None:
    """Nothing of devshim's environment, and nothing its launcher's interpreter adds (it sets
    LC_CTYPE in the C locale): PATH, HOME, LC_CTYPE are absent unless configured."""
    async with serving(plugin_dir, state_dir, env={"ONLY": "1", "ALSO": "2"}) as session:
        assert (await driver_ids(session))[3] == "env-ALSO_ONLY"


# --- stderr -----------------------------------------------------------------------------------


async def test_a_driver_flooding_stderr_is_neither_blocked_nor_logged_unbounded(
    plugin_dir: Path, state_dir: Path, log: list[tuple[str, str]]
) -> None:
    """Each Allocate makes the driver write a 100 MiB line without a newline (beyond the 32 MiB
    line limit of devshim's stream readers, and the 64 MiB they buffer) and then 100,000 lines
    before it answers: a devshim that stopped reading would block it and Allocate with it.
    Both answer promptly; the log holds the long line cut at 4 KiB with a marker, at most 100
    lines a second, and warnings that account for every line dropped."""
    flood = 100_000
    env = {"HARDENED_HUGE_BYTES": str(100 * 1024 * 1024), "HARDENED_FLOOD_LINES": str(flood)}
    async with serving(plugin_dir, state_dir, env=env, timeouts={"allocate_s": 15}) as session:
        device = (await driver_ids(session))[0]
        for _ in range(2):
            await asyncio.sleep(1.1)  # each burst starts a rate window of its own
            started = time.monotonic()
            assert (await session.allocate([device])).envs == {"WHO": device}
            print(f"[figures] Allocate with a 100 MiB line and {flood} lines on stderr: "
                  f"{time.monotonic() - started:.2f} s")  # fmt: skip
        await driver_ids(session)  # ListAndWatch still serves

        def accounted() -> tuple[int, int]:
            """The driver's stderr lines logged, and those the warnings say were dropped."""
            dropped = 0
            logged = 0
            for _, message in log:
                if match := re.fullmatch(r"driver 'hardened': (\d+) stderr lines dropped .*", message):
                    dropped += int(match[1])
                else:
                    logged += 1
            return logged, dropped

        written = 1 + 2 * (1 + 1 + flood)  # its start line; per burst the long one, marker, flood
        deadline = time.monotonic() + 5
        while sum(accounted()) < written and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # the last window's warning comes when it ends
    logged, dropped = accounted()
    assert logged + dropped == written
    assert logged <= 1 + 2 * 100
    cut = [m for _, m in log if m.endswith("[line cut at 4096 bytes]")]
    assert len(cut) == 2 and all(len(m) == len("driver 'hardened': ") + 4096 + 25 for m in cut)
    assert sum(m == f"driver 'hardened': marker {device}" for _, m in log) == 2
    assert any(
        level == "WARNING" and m.endswith("stderr lines dropped (more than 100 lines/s)") for level, m in log
    )


@pytest.fixture
def driver_log() -> Iterator[list[tuple[str, str]]]:
    """What devshim logged of the hardened driver's `log` notifications (sent at ERROR) and the
    warnings about dropped ones, during the test: (level, message)."""
    entries: list[tuple[str, str]] = []

    def sink(message: Any) -> None:
        level, text = message.record["level"].name, message.record["message"]
        if text.startswith("driver 'hardened': ") and (level == "ERROR" or "log messages dropped" in text):
            entries.append((level, text))  # the driver's log is at ERROR; its stderr at INFO

    sink_id = logger.add(sink, level="INFO")
    try:
        yield entries
    finally:
        logger.remove(sink_id)


async def test_a_driver_flooding_log_notifications_is_logged_bounded_and_cannot_forge_a_line(
    plugin_dir: Path, state_dir: Path, driver_log: list[tuple[str, str]]
) -> None:
    """The Allocate makes the driver send 900 `log` notifications of 64 KiB (about 58 MiB, under the
    1,000 a second that would restart it), the first forging a second, devshim-like ERROR line for
    another resource with a newline. Allocate answers; at most 100 a second reach the log, each one
    line cut at 4 KiB; the newline shows escaped; one warning says how many were dropped."""
    async with serving(plugin_dir, state_dir, env={"HARDENED_LOG_FLOOD": "900"}) as session:
        device = (await driver_ids(session))[0]
        assert (await session.allocate([device])).envs == {"WHO": device}

        def dropped() -> int:
            counts = [
                re.fullmatch(r"driver 'hardened': (\d+) log messages dropped .*", m) for _, m in driver_log
            ]
            return sum(int(found[1]) for found in counts if found)

        deadline = time.monotonic() + 10
        while len(driver_log) - (dropped() > 0) + dropped() < 900 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # the window's warning comes when it ends
    lines = [m for level, m in driver_log if level == "ERROR"]
    assert 0 < len(lines) <= 100 and len(lines) + dropped() == 900
    assert all("\n" not in m and len(m) <= len("driver 'hardened': ") + 4096 + 25 for m in lines)
    assert lines[0].startswith("driver 'hardened': forged\\x0a2026-12-01 00:00:00.000 | ERROR")
    assert any(m.endswith("log messages dropped (more than 100 lines/s)") for _, m in driver_log)


# --- devshim as a real process ------------------------------------------------------------------


def write_config(path: Path, plugin_dir: Path, state_dir: Path, **driver_settings: Any) -> Path:
    config = {
        "device_plugins_dir": str(plugin_dir),
        "state_dir": str(state_dir),
        "http": {"enabled": False},
        "drivers": [driver(**driver_settings)],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def driver_children(pid: int) -> list[int]:
    """devshim's child processes that run the driver program (after the launcher's exec)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if str(HARDENED).encode() in cmdline and b"-c" not in cmdline.split(b"\0"):
                found.append(int(child))
    return found


def real_uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@needs_nobody
def test_a_driver_run_as_another_user_dies_with_devshim_even_by_sigkill(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """Changing ids clears the parent-death signal, so the launcher arms it after the switch: a
    driver running as nobody still dies when devshim is SIGKILLed."""
    config = write_config(
        tmp_path / "c.yaml",
        plugin_dir,
        state_dir,
        python=NOBODY_PYTHON,
        user="nobody",
        env={"HARDENED_STAY": "1"},
    )
    devshim = subprocess.Popen(
        [sys.executable, "-m", "shim", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children: list[int] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while not (children := driver_children(devshim.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(children) == 1, "the driver did not start"
        (child,) = children
        assert real_uid(child) == NOBODY
        devshim.kill()
        devshim.wait()
        deadline = time.monotonic() + 5
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(child), "the driver outlived devshim"
    finally:
        if devshim.poll() is None:
            devshim.kill()
            devshim.wait()
        for child in children:  # an orphan, if the test failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not can_drop_capabilities(), reason="needs root and setpriv that may drop capabilities")
async def test_without_the_privilege_to_switch_users_the_driver_fails_with_a_clear_reason(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """devshim as root without CAP_SETUID and CAP_SETGID (the DaemonSet's default drops every
    capability) cannot run a driver as nobody: each start fails saying so, and after
    max_start_failures the driver stays down with that reason."""
    config = write_config(
        tmp_path / "c.yaml",
        plugin_dir,
        state_dir,
        user="nobody",
        restart={"max_start_failures": 2, "backoff_initial_s": 0.05},
    )
    devshim = await asyncio.create_subprocess_exec(
        *("setpriv", "--bounding-set=-setuid,-setgid", "--"),
        *(sys.executable, "-m", "shim", "run", "--config", str(config)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert devshim.stderr is not None
    lines: list[bytes] = []
    try:
        async with asyncio.timeout(WAIT_S):
            while b"stays down" not in (line := await devshim.stderr.readline()):
                assert line, b"".join(lines).decode()
                lines.append(line)
    finally:
        devshim.terminate()
        await devshim.wait()
    reason = (
        "cannot run as uid 65534, gid 65534, groups 65534: Operation not permitted (running a "
        "driver as another user or group needs CAP_SETUID and CAP_SETGID)"
    )
    assert reason in line.decode()

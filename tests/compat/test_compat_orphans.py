"""What a plugin or driver under `devshim compat` leaves behind ends with compat, as under `devshim
run` (shim/driverhost/reaper.py): compat is a child subreaper, ends a plugin's descendants with
the plugin, and kills what is still running when it leaves. Real `devshim compat` processes; the
plugin is tests/support/legacy_plugins/leaving.py, the driver the flaky SDK driver."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import DRIVERS, LEGACY_PLUGINS
from tests.support.devshim_process import DEVSHIM, runs
from tests.support.waiting import until

LEAVING = LEGACY_PLUGINS / "leaving.py"
COMPAT_S = 120.0  # a run of one or two cells, on a busy machine
GONE_S = 10.0


def _pids(path: Path, marker: str) -> list[int]:
    """The pids the program under test wrote to `path`: "child <pid>" lines after `marker`, or
    a bare pid a line."""
    words = path.read_text().split() if path.exists() else []
    if marker:
        return [int(words[i + 1]) for i, word in enumerate(words) if word == marker]
    return [int(word) for word in words]


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test expects gone; those still running at its end (the test failed) are killed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if runs(pid) and (b"sleep" in command or b"leaving.py" in command):  # not a reused pid
                os.kill(pid, signal.SIGKILL)


async def _compat(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`devshim compat ARGS...` to its end: its exit status and its stderr."""
    proc = await asyncio.create_subprocess_exec(
        *DEVSHIM, "compat", *args, env=env, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(COMPAT_S):
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.mark.parametrize("how", ["setsid", "daemon"])
async def test_what_a_plugin_leaves_in_a_session_of_its_own_ends_with_compat(
    tmp_path: Path, leftovers: list[int], how: str
) -> None:
    """The plugin starts a child that calls setsid(), which a kill of the plugin's process group
    misses: as the plugin's child (setsid), or orphaned while the plugin runs (daemon, a double
    fork). After `devshim compat --plugin` has exited, that process is gone (before: it ran on,
    adopted by init)."""
    pid_file = tmp_path / "pids"
    command = f"env DP_DIR={{dir}} {shlex.quote(sys.executable)} {shlex.quote(str(LEAVING))} {pid_file} {how}"
    code, err = await _compat(
        "--plugin", command, "--scenario", "options", "--profile", "1.33+", "--cell-timeout", "3"
    )
    assert code == 1, err  # the plugin never serves: its cell fails, and compat still ends
    leftovers.extend(_pids(pid_file, ""))
    assert leftovers, f"the plugin left no pid in {pid_file}; compat said:\n{err}"
    await until(lambda: not any(map(runs, leftovers)), f"{leftovers} are gone", timeout=GONE_S)


async def test_a_daemon_a_driver_leaves_ends_with_compat(tmp_path: Path, leftovers: list[int]) -> None:
    """compat --driver runs the driver in-process as `run` does: the daemon it starts (a session
    of its own) is gone once compat has exited (before: it ran on, adopted by init)."""
    run_file = tmp_path / "runs"
    env = {**os.environ, "RUN_FILE": str(run_file), "FLAKY_CHILD": "daemon"}
    driver = f"{shlex.quote(sys.executable)} {shlex.quote(str(DRIVERS / 'flaky.py'))}"
    code, err = await _compat(
        "--driver", driver, "--relaxed", "--scenario", "register", "--profile", "1.33+",
        "--kubelet", "v1beta1", "--registration", "classic", "--cell-timeout", "30", env=env,
    )  # fmt: skip
    leftovers.extend(_pids(run_file, "child"))
    assert leftovers, f"the driver started no child; compat exited {code}:\n{err}"
    await until(lambda: not any(map(runs, leftovers)), f"{leftovers} are gone", timeout=GONE_S)

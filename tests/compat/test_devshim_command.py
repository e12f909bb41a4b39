"""`devshim run` as a real process: start, register, SIGTERM/SIGINT cleanup, clear errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shim.compat.fakekubelet import FakeKubelet
from tests.support import DRIVERS
from tests.support.devshim_process import DEVSHIM, children, devshim, start_devshim


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_stops_devshim_cleanly_removing_only_its_sockets(
    plugin_dir: Path, kubelet: FakeKubelet, sig: int
) -> None:
    """After registering, a signal makes devshim exit 0 within seconds, its sockets gone and
    kubelet.sock and another plugin's socket untouched."""
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(plugin_dir / "vendor-other.sock"))
        async with devshim(
            *("run", "--device-plugins-dir", str(plugin_dir)),
            *("-r", "example.com/foo=2", "-r", "example.com/bar=1"),
        ) as proc:
            for resource in ("example.com/foo", "example.com/bar"):
                session = await kubelet.wait_for_plugin(resource, timeout=30)
                await session.wait_for_list()
            proc.send_signal(sig)
            async with asyncio.timeout(10):
                _, stderr = await proc.communicate()
        assert proc.returncode == 0, stderr.decode()
        names = sorted(p.name for p in plugin_dir.iterdir())
        assert names == ["kubelet.sock", "vendor-other.sock"]  # the kubelet's and another plugin's stay


async def test_sigterm_stops_the_drivers_too(plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet) -> None:
    """A driver given with --driver serves its declared resource; on SIGTERM devshim stops it
    before exiting, so no driver process outlives devshim."""
    sim = json.dumps({"resources": [{"name": "example.com/cli", "count": 2}]})
    command = f"{shlex.quote(sys.executable)} -m devshim_adapters.sim --config-json {shlex.quote(sim)}"
    async with devshim(
        *("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir)),
        *(
            "--driver",
            f"sim={command}",
            "--driver-resource",
            "sim=example.com/cli",
            "--driver-user",
            "sim=root",
        ),
    ) as proc:
        session = await kubelet.wait_for_plugin("example.com/cli", timeout=30)
        assert [d.id for d in await session.wait_for_list()] == ["cli-0", "cli-1"]
        drivers = children(proc.pid)
        assert drivers, "the driver should be a child process of devshim"
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            _, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    for pid in drivers:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def run_devshim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEVSHIM, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["-r", "foo=2"], "not an extended resource name", id="bad-name"),
        pytest.param(["-r", "example.com/foo"], "expected NAME=COUNT", id="bad-spec"),
        pytest.param([], "nothing to serve", id="nothing"),
        pytest.param(["-c", "/nonexistent/devshim.yaml"], "cannot read config file", id="no-file"),
        pytest.param(["--driver", "sim"], "expected NAME=COMMAND", id="bad-driver-spec"),
        pytest.param(["--driver", "Sim=x"], "drivers[0].name", id="bad-driver-name"),
        pytest.param(["--driver", "sim=x"], "--driver-resource sim=RESOURCE", id="driver-serving-nothing"),
        pytest.param(["-d", "sim=x", "--driver-env", "sim"], "expected NAME=KEY=VALUE", id="bad-env-spec"),
        pytest.param(
            ["-d", "sim=x", "-e", "other=A=1"], "no --driver is named 'other'", id="env-for-no-driver"
        ),
        pytest.param(
            ["-d", "sim=x", "-e", "sim=DEVSHIM_TEST_UNSET"], "DEVSHIM_TEST_UNSET is not set", id="env-unset"
        ),
    ],
)
def test_bad_settings_exit_2_with_a_clear_message(plugin_dir: Path, args: list[str], message: str) -> None:
    """Bad input is refused before anything is served, and nothing is created."""
    result = run_devshim("run", "--device-plugins-dir", str(plugin_dir), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert list(plugin_dir.iterdir()) == []


def test_a_regular_file_in_the_socket_path_is_refused_at_start(plugin_dir: Path, tmp_path: Path) -> None:
    """devshim will not delete a file that is not its socket (a configured socket_name); it exits
    1 saying why."""
    (plugin_dir / "foo.sock").write_text("someone's data")
    config = tmp_path / "devshim.yaml"
    config.write_text("resources: [{name: example.com/foo, socket_name: foo.sock, static: {count: 1}}]\n")
    result = run_devshim("run", "--device-plugins-dir", str(plugin_dir), "--config", str(config))
    assert result.returncode == 1
    assert "is not a socket; refusing to replace it" in result.stderr
    assert (plugin_dir / "foo.sock").read_text() == "someone's data"


def test_help_describes_run_and_its_options() -> None:
    """`devshim run --help` names every option a new user needs."""
    result = run_devshim("run", "--help")
    assert result.returncode == 0
    for option in ("--config", "--device-plugins-dir", "--resource", "--log-level", "--driver-env"):
        assert option in result.stdout


async def test_driver_env_gives_a_driver_the_variables_named_and_nothing_else(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--driver-env NAME=KEY=VALUE` sets a variable in that --driver's environment (a value may
    hold '=' or be empty), `NAME=KEY` passes on devshim's own; the driver sees those and none of
    devshim's other variables."""
    monkeypatch.setenv("DEVSHIM_TEST_PASSED_ON", "from devshim")
    monkeypatch.setenv("DEVSHIM_TEST_KEPT_BACK", "secret")
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(DRIVERS / 'showing_env.py'))}"
    async with devshim(
        *("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir)),
        *(
            "--driver",
            f"env={command}",
            "--driver-user",
            "env=root",
            "--driver-env",
            "env=GREETING=a=b c",
            "-e",
            "env=EMPTY=",
        ),
        *("-e", "env=DEVSHIM_TEST_PASSED_ON", "-e", "env=PATH"),
        *("--driver-resource", "env=example.com/env", "--driver-allow", "env=envs:SEEN_*"),
    ):
        session = await kubelet.wait_for_plugin("example.com/env", timeout=30)
        grant = await session.allocate([(await session.wait_for_list())[0].id])
    assert {k.removeprefix("SEEN_"): v for k, v in grant.envs.items()} == {
        "GREETING": "a=b c",
        "EMPTY": "",
        "DEVSHIM_TEST_PASSED_ON": "from devshim",
        "PATH": os.environ["PATH"],
    }


async def test_the_ops_endpoint_is_logged_once_with_its_bound_port(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """One line says where /metrics, /healthz, /readyz and /status are served, naming the port
    actually bound (the tests ask for port 0: any free one)."""
    async with devshim(
        *("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir)),
        *("-r", "example.com/foo=1"),
    ) as proc:
        await kubelet.wait_for_registration("example.com/foo", timeout=30)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            _, stderr = await proc.communicate()
    lines = [line for line in stderr.decode().splitlines() if "/metrics" in line]
    assert len(lines) == 1, lines
    assert re.search(
        r"ops endpoint: serving /metrics, /healthz, /readyz and /status on 0\.0\.0\.0:[1-9]", lines[0]
    )


async def test_a_driver_that_cannot_start_stays_down_while_others_are_served(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """A missing driver program is retried with backoff, then given up with a log line naming
    the driver and the cause, while devshim keeps serving its other resources."""
    proc = await start_devshim(
        *("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir)),
        *("-r", "example.com/ok=1"),
        *("--driver", "gone=/nonexistent/driver", "--driver-resource", "gone=example.com/gone"),
    )
    try:
        await kubelet.wait_for_registration("example.com/ok", timeout=30)
        assert proc.stderr is not None
        lines: list[str] = []
        while not any("stays down" in line for line in lines):
            async with asyncio.timeout(30):
                line = await proc.stderr.readline()
            assert line, "devshim exited: " + "".join(lines)
            lines.append(line.decode())
        assert proc.returncode is None
        assert any("cannot run '/nonexistent/driver': No such file or directory" in line for line in lines)
        assert (await kubelet.plugin("example.com/ok").allocate(["dev0"])) is not None
    finally:
        proc.terminate()
        await proc.wait()


async def exited(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` (not our child) exits within ``timeout``: waits on a pidfd."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    gone = loop.create_future()
    loop.add_reader(fd, gone.set_result, None)
    try:
        async with asyncio.timeout(timeout):
            await gone
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def test_a_killed_devshim_leaves_no_driver_running(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """SIGKILL gives devshim no chance to stop its drivers; the parent-death signal armed at
    their start makes the kernel kill them too, even one that ignores EOF and SIGTERM."""
    stubborn = DRIVERS / "stubborn.py"
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(stubborn))}"
    async with devshim(
        *("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir)),
        *(
            "--driver",
            f"sim={command}",
            "--driver-resource",
            "sim=example.com/orphan",
            "--driver-user",
            "sim=root",
        ),
    ) as proc:
        await kubelet.wait_for_plugin("example.com/orphan", timeout=30)
        (driver,) = children(proc.pid)
        proc.kill()
        await proc.wait()
        assert await exited(driver, 10), f"driver {driver} outlived a SIGKILLed devshim"

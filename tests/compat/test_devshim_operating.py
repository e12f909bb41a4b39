"""Operating devshim as a real process: check-config, SIGHUP reload, JSON logs."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from shim.kubelet import FakeKubelet
from tests.support import DRIVERS
from tests.support.devshim_process import DEVSHIM, children, devshim, free_port, http_get

LIFECYCLE = str(DRIVERS / "lifecycle.py")


def sim(name: str, count: int) -> list[str]:
    config = json.dumps({"resources": [{"name": name, "count": count}]})
    return [sys.executable, "-m", "devshim_adapters.sim", "--config-json", config]


def write_config(path: Path, plugin_dir: Path, state_dir: Path, **fields: Any) -> None:
    path.write_text(
        yaml.safe_dump({"device_plugins_dir": str(plugin_dir), "state_dir": str(state_dir), **fields})
    )


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEVSHIM, "check-config", str(path)], capture_output=True, text=True, timeout=60)


def test_check_config_accepts_a_valid_file_and_summarises_it(tmp_path: Path) -> None:
    config = tmp_path / "devshim.yaml"
    write_config(config, tmp_path / "dp", tmp_path / "state",
                 resources=[{"name": "example.com/a", "static": {"count": 2}}],
                 drivers=[{"name": "sim", "command": sim("example.com/s", 1)}])  # fmt: skip
    result = check_config(config)
    assert result.returncode == 0, result.stderr
    assert "valid; serves example.com/a, driver sim; classic registration; API v1beta1" in result.stdout


def test_check_config_names_every_problem_with_its_location_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "devshim.yaml"
    config.write_text(
        "resources:\n  - name: requests.example.com/a\n    static: {count: 1}\n"
        "drivers:\n  - name: sim\n    command: []\n  - name: x\n    comand: [x]\nlog_format: xml\n"
    )
    result = check_config(config)
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == f"devshim: invalid settings in {config}:"
    for location in ("resources[0].name", "drivers[0].command", "drivers[1].command", "drivers[1].comand",
                     "log_format"):  # fmt: skip
        assert any(line.startswith(f"  {location}: ") for line in lines), (location, lines)


def test_check_config_of_a_missing_or_broken_file_says_so(tmp_path: Path) -> None:
    assert "cannot read config file" in check_config(tmp_path / "none.yaml").stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("resources: [\n")
    result = check_config(broken)
    assert (
        result.returncode == 2 and "is not valid YAML" in result.stderr and "Traceback" not in result.stderr
    )


def driver_pids(devshim_pid: int) -> dict[str, int]:
    """The driver processes under devshim, by the resource or script their command line names."""
    found = {}
    for pid in children(devshim_pid):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        key = "life" if "lifecycle.py" in cmdline else "sim" if "devshim_adapters.sim" in cmdline else cmdline
        found[key] = pid
    return found


async def test_sighup_reloads_the_config_restarting_only_what_changed(
    tmp_path: Path, plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """A changed static resource and a changed driver are restarted, a new resource is served, an
    unchanged driver keeps running; a broken config on a later SIGHUP changes nothing."""
    config = tmp_path / "devshim.yaml"
    life = {"name": "life", "command": [sys.executable, LIFECYCLE]}
    write_config(config, plugin_dir, state_dir, resources=[{"name": "example.com/a", "static": {"count": 1}}],
                 drivers=[life, {"name": "sim", "command": sim("example.com/s", 1)}])  # fmt: skip
    async with devshim("run", "--config", str(config)) as proc:
        for resource in ("example.com/a", "example.com/life", "example.com/s"):
            await (await kubelet.wait_for_plugin(resource, timeout=30)).wait_for_list()
        before = driver_pids(proc.pid)
        assert set(before) == {"life", "sim"}

        write_config(config, plugin_dir, state_dir,
                     resources=[{"name": "example.com/a", "static": {"count": 3}},
                                {"name": "example.com/b", "static": {"count": 1}}],
                     drivers=[life, {"name": "sim", "command": sim("example.com/s", 2)}])  # fmt: skip
        proc.send_signal(signal.SIGHUP)
        session_b = await kubelet.wait_for_plugin("example.com/b", timeout=30)
        assert len(await session_b.wait_for_list()) == 1
        await kubelet.wait_for_registration("example.com/a", count=2, timeout=30)
        assert len(await kubelet.plugin("example.com/a").wait_for_list(lambda ds: len(ds) == 3)) == 3
        await kubelet.wait_for_registration("example.com/s", count=2, timeout=30)
        assert len(await kubelet.plugin("example.com/s").wait_for_list(lambda ds: len(ds) == 2)) == 2
        after = driver_pids(proc.pid)
        assert after["life"] == before["life"] and after["sim"] != before["sim"]
        assert len([r for r in kubelet.registrations if r.resource_name == "example.com/life"]) == 1

        config.write_text("resources: [{name: bad}]\n")
        proc.send_signal(signal.SIGHUP)
        await asyncio.sleep(1.0)
        assert proc.returncode is None and driver_pids(proc.pid) == after
        assert not kubelet.plugin("example.com/b").stream_ended.is_set()

        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            _, stderr = await proc.communicate()
    assert proc.returncode == 0
    assert "the new config is not used, nothing changed" in stderr.decode()


# Files a SIGHUP may find where the config was (None: a FIFO, which blocked the old reader).
UNLOADABLE = {
    "not UTF-8": b"log_level: \xe9\n",
    "a list nested 100k deep": b"resources: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "a FIFO": None,
}


async def _logged(proc: asyncio.subprocess.Process, text: str, timeout: float = 30) -> None:
    assert proc.stderr is not None
    async with asyncio.timeout(timeout):
        while text not in (await proc.stderr.readline()).decode(errors="replace"):
            pass


async def test_a_config_that_cannot_be_loaded_on_sighup_changes_nothing(
    tmp_path: Path, plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """Each unloadable file, reloaded by SIGHUP, is refused with one log line while devshim keeps
    serving (the kubelet's stream stays open, Allocate answers); check-config exits 2 with one line."""
    config = tmp_path / "devshim.yaml"
    write_config(config, plugin_dir, state_dir, resources=[{"name": "example.com/a", "static": {"count": 2}}])
    async with devshim("run", "--config", str(config)) as proc:
        session = await kubelet.wait_for_plugin("example.com/a", timeout=30)
        device = (await session.wait_for_list())[0].id
        for name, content in UNLOADABLE.items():
            config.unlink()
            if content is None:
                os.mkfifo(config)
            else:
                config.write_bytes(content)
            proc.send_signal(signal.SIGHUP)
            await _logged(proc, "SIGHUP: the new config is not used, nothing changed")
            assert await session.allocate([device]) is not None, name  # answered, not timed out
            assert proc.returncode is None and not session.stream_ended.is_set(), name
            checked = check_config(config)
            assert checked.returncode == 2 and len(checked.stderr.splitlines()) == 1, (name, checked.stderr)


async def test_json_logs_are_one_object_per_line_naming_the_resource(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    async with devshim(
        *("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir)),
        *("--log-format", "json"),
        *("-r", "example.com/foo=1", "--driver", f"life={sys.executable} {LIFECYCLE}"),
    ) as proc:
        await kubelet.wait_for_registration("example.com/foo", timeout=30)
        await kubelet.wait_for_registration("example.com/life", timeout=30)
        with pytest.raises(grpc.aio.AioRpcError):  # an unknown device: refused, and logged
            await (await kubelet.wait_for_plugin("example.com/foo")).allocate(["no-such-device"])
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            _, stderr = await proc.communicate()
    records = [json.loads(line) for line in stderr.decode().splitlines()]
    assert all({"time", "level", "message"} <= set(r) for r in records)
    registered = {r.get("resource"): r for r in records if "registered with the kubelet" in r["message"]}
    assert set(registered) >= {"example.com/foo", "example.com/life"}
    assert registered["example.com/life"]["driver"] == "life"
    refused = [r for r in records if "no-such-device" in r["message"]]
    assert refused and refused[0]["resource"] == "example.com/foo" and refused[0]["version"] == "v1beta1"


async def test_status_metrics_and_probes_of_a_running_devshim(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`devshim status` reads the running process: resources, negotiated version, devices by
    health, the driver (found on devshim's PATH by its bare name, with an empty environment) and
    its calls; /readyz turns 200 once registered; /metrics counts the Allocate just made."""
    if shutil.which("devshim-sim") is None:
        pytest.skip("devshim-sim is not on PATH (the project is not installed in this environment)")
    port = free_port()
    monkeypatch.setenv("DEVSHIM_HTTP__PORT", str(port))
    sim_config = json.dumps({"resources": [{"name": "example.com/st", "count": 2}]})
    async with devshim(
        *("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir)),
        *("-r", "example.com/foo=3", "--driver", f"sim=devshim-sim --config-json '{sim_config}'"),
    ) as proc:
        session = await kubelet.wait_for_plugin("example.com/st", timeout=30)
        await session.allocate([(await session.wait_for_list())[0].id])
        await kubelet.wait_for_registration("example.com/foo", timeout=30)
        ready = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/readyz")
        assert ready == (200, "every resource is registered\n")
        status = await asyncio.to_thread(
            subprocess.run, [*DEVSHIM, "status", "--address", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert (
            "example.com/foo: registered as v1beta1, 1 registrations; 3 Healthy, 0 Unhealthy" in status.stdout
        )
        assert "example.com/st: registered as v1beta1" in status.stdout
        assert "driver sim: up (pid " in status.stdout
        raw = json.loads(
            (
                await asyncio.to_thread(
                    subprocess.run,
                    [*DEVSHIM, "status", "--json", "--address", f"127.0.0.1:{port}"],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
            ).stdout  # fmt: skip
        )
        assert raw["drivers"]["sim"]["calls"]["allocate"]["ok"] == 1
        code, metrics = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/metrics")
        assert code == 200
        labels = 'code="OK",method="Allocate",resource="example.com/st",version="v1beta1"'
        assert f"devshim_rpc_requests_total{{{labels}}} 1.0" in metrics
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            await proc.communicate()
    assert proc.returncode == 0


def test_status_without_a_running_devshim_says_so(tmp_path: Path) -> None:
    result = subprocess.run(
        [*DEVSHIM, "status", "--address", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1 and "no devshim answers at http://127.0.0.1:" in result.stderr
    assert "Traceback" not in result.stderr

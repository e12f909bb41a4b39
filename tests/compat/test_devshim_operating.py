"""Operating devshim as a real process: check-config, SIGHUP reload, JSON logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from shim.compat.fakekubelet import FakeKubelet
from shim.compat.realnode.node import free_port
from tests.support import DRIVERS, ROOT
from tests.support.devshim_process import DEVSHIM, children, devshim, http_get

LIFECYCLE = str(DRIVERS / "lifecycle.py")


def sim(name: str, count: int) -> list[str]:
    config = json.dumps({"resources": [{"name": name, "count": count}]})
    return [sys.executable, "-m", "devshim_adapters.sim", "--config-json", config]


def sim_driver(name: str, count: int) -> dict[str, Any]:
    """drivers[sim]: the simulator serving ``count`` devices of resource ``name``, declared."""
    return {"name": "sim", "user": "root", "command": sim(name, count), "resources": [name]}


def write_config(path: Path, plugin_dir: Path, state_dir: Path, **fields: Any) -> None:
    path.write_text(
        yaml.safe_dump({"device_plugins_dir": str(plugin_dir), "state_dir": str(state_dir), **fields})
    )


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEVSHIM, "check-config", str(path)], capture_output=True, text=True, timeout=60)


def test_check_config_accepts_a_valid_file_and_summarises_it(tmp_path: Path) -> None:
    config = tmp_path / "devshim.yaml"
    short = Path("/tmp/ds-check")  # check-config refuses socket paths past sun_path; none is made
    write_config(config, short / "dp", short / "state",
                 resources=[{"name": "example.com/a", "static": {"count": 2}}],
                 drivers=[sim_driver("example.com/s", 1)])  # fmt: skip
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
    life = {
        "name": "life",
        "user": "root",
        "command": [sys.executable, LIFECYCLE],
        "resources": ["example.com/life"],
    }
    write_config(config, plugin_dir, state_dir, resources=[{"name": "example.com/a", "static": {"count": 1}}],
                 drivers=[life, sim_driver("example.com/s", 1)])  # fmt: skip
    async with devshim("run", "--config", str(config)) as proc:
        for resource in ("example.com/a", "example.com/life", "example.com/s"):
            await (await kubelet.wait_for_plugin(resource, timeout=30)).wait_for_list()
        before = driver_pids(proc.pid)
        assert set(before) == {"life", "sim"}

        write_config(config, plugin_dir, state_dir,
                     resources=[{"name": "example.com/a", "static": {"count": 3}},
                                {"name": "example.com/b", "static": {"count": 1}}],
                     drivers=[life, sim_driver("example.com/s", 2)])  # fmt: skip
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
        *(
            "-r",
            "example.com/foo=1",
            "--driver",
            f"life={sys.executable} {LIFECYCLE}",
            "--driver-user",
            "life=root",
        ),
        *("--driver-resource", "life=example.com/life"),
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
        *(
            "-r",
            "example.com/foo=3",
            "--driver",
            f"sim=devshim-sim --config-json '{sim_config}'",
            "--driver-user",
            "sim=root",
        ),
        *("--driver-resource", "sim=example.com/st"),
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
            "example.com/foo: registered as v1beta1, 1 registration; 3 Healthy, 0 Unhealthy" in status.stdout
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
    assert "nothing listens there; is devshim running, with http enabled?" in result.stderr
    assert "Traceback" not in result.stderr


async def devshim_status(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [*DEVSHIM, "status", *args], capture_output=True, text=True, timeout=30
    )


async def status_once(port: int, holds: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The running devshim's /status document, once it answers and ``holds``."""
    try:
        async with asyncio.timeout(30):
            while True:
                with contextlib.suppress(OSError):  # not listening yet
                    code, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/status")
                    report: dict[str, Any] = json.loads(body) if code == 200 else {}
                    if report and holds(report):
                        return report
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def test_status_of_static_resources_alone_says_why_no_deallocation_runs(
    plugin_dir: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Static devices need no release, so no deallocation emulation runs for them: the status
    says so, as it says on or off where drivers are served, never a 'starting' that never ends."""
    port = free_port()
    monkeypatch.setenv("DEVSHIM_HTTP__PORT", str(port))
    async with devshim("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir),
                       "-r", "example.com/foo=2"):  # fmt: skip
        report = await status_once(port, lambda r: "example.com/foo" in r["resources"], "foo served")
        shown = await devshim_status()
    why = "not running: no drivers to tell (static devices need no release)"
    assert report["deallocation"] == why
    assert shown.returncode == 0 and f"deallocation emulation: {why}" in shown.stdout, shown.stderr


async def test_status_counts_a_failed_start_and_claims_no_devices_for_a_driver_without_any(
    plugin_dir: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver that never started shows as down with its failed starts counted, why the last
    failed, and no pid; neither it nor a running driver whose resource has no devices is shown
    with devices (Healthy or Unhealthy) it does not have."""
    port = free_port()
    monkeypatch.setenv("DEVSHIM_HTTP__PORT", str(port))

    def settled(report: dict[str, Any]) -> bool:
        drivers = report["drivers"]
        return bool(drivers["gone"]["status"].startswith("down") and drivers["empty"]["status"] == "up")

    async with devshim(
        *("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir)),
        *("--driver", "gone=/nonexistent/driver", "--driver-resource", "gone=example.com/gone"),
        *("--driver", f"empty={shlex.join(sim('example.com/none', 0))}", "--driver-user", "empty=root"),
        *("--driver-resource", "empty=example.com/none"),
    ):
        report = await status_once(port, settled, "gone is given up and empty is up")
        shown = await devshim_status("--address", f"127.0.0.1:{port}")
    gone = report["drivers"]["gone"]
    assert (gone["failures"], gone["pid"]) == (5, None)  # restart.max_start_failures
    lines = shown.stdout.splitlines()
    at = lines.index("  driver gone: down, 5 failures, serving nothing")
    assert lines[at + 1] == "    last failure: cannot run '/nonexistent/driver': No such file or directory"
    # No kubelet here: the reason is said, as the log says it.
    waiting = f"waiting for the kubelet to create {plugin_dir / 'kubelet.sock'}"
    assert f"  example.com/none: NOT registered ({waiting}), 0 registrations; no devices" in lines
    assert any(
        line.startswith("  driver empty: up (pid ") and "serving example.com/none" in line for line in lines
    )
    assert not [line for line in lines if "Healthy" in line], shown.stdout


# What another program holding devshim's port answers a GET of /status (None: nothing, it
# closes the connection), and what `devshim status` then says it saw.
OTHER_PROGRAMS = {
    "http-404": (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "HTTP 404 for /status"),
    "http-page": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\r\n<html></html>",
        "it answered b'<html></html>'",
    ),
    "not-http": (b"SSH-2.0-OpenSSH_9.6\r\n", "no HTTP answer: BadStatusLine"),
    "silent-close": (None, "no HTTP answer: RemoteDisconnected"),
}


@contextlib.contextmanager
def other_program(answer: bytes | None) -> Iterator[int]:
    """A listener on a free port of every address, as another program on the node would hold
    devshim's port: each connection's request is read, ``answer`` sent, the connection closed."""
    listener = socket.create_server(("0.0.0.0", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with connection:
                connection.recv(65536)
                if answer is not None:
                    connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        listener.close()
        thread.join(10)


@pytest.mark.parametrize("program", OTHER_PROGRAMS)
async def test_status_says_when_another_program_holds_devshims_port(
    plugin_dir: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch, program: str
) -> None:
    """devshim serves without its ops endpoint when another program holds the port, and logs
    why; `devshim status` (finding the port in the same settings) then says the port is served
    by something other than devshim, and what answered, instead of a bare error."""
    answer, seen = OTHER_PROGRAMS[program]
    with other_program(answer) as port:
        monkeypatch.setenv("DEVSHIM_HTTP__PORT", str(port))
        async with devshim("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir),
                           "-r", "example.com/foo=1") as proc:  # fmt: skip
            await _logged(proc, f"ops endpoint: cannot listen on 0.0.0.0:{port}")
            shown = await devshim_status()
    assert shown.returncode == 1 and "Traceback" not in shown.stderr
    assert f"port {port} is served by something other than devshim ({seen}" in shown.stderr, shown.stderr


def test_the_port_taken_message_shown_in_docs_operations_md_is_the_one_printed() -> None:
    """The `devshim status` message docs/operations.md shows (for port 9477) is what an operator
    gets when another program answers 404 on the ops port."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    sample = re.search(r"^ *(devshim status: no devshim answers at \S+: port 9477 .*)$", doc, re.M)
    assert sample, "the port-taken message is gone from docs/operations.md"
    with other_program(OTHER_PROGRAMS["http-404"][0]) as port:
        result = subprocess.run(
            [*DEVSHIM, "status", "--address", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30
        )
    assert result.returncode == 1
    assert result.stderr.strip() == sample.group(1).replace("9477", str(port))

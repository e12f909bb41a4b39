"""The driver SDK (shim.sdk) through the real simulator process: concurrency, the protocol's
errors, the version check, a 50,000-device list, and the simulator's config errors."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import time
import tty
from pathlib import Path
from typing import Any

import pytest

from shim.driverprotocol import PROTOCOL_VERSION
from shim.sdk.errors import InvalidParams
from shim.sdk.server import check_protocol_version
from tests.support.driver_process import ROOT, SIM, DriverProcess, running_sim

SIM_RESOURCE = {"name": "example.com/sim", "devices": [{"id": "sim-a", "numa_nodes": [0]}, {"id": "sim-b"}]}


async def test_a_slow_preferred_allocation_does_not_hold_up_an_allocate(tmp_path: Path) -> None:
    """Requests run concurrently (docs/driver-protocol.md, "Transport"): an allocate sent after a
    preferred_allocation that takes a second is answered first, and both are answered."""
    resource = {**SIM_RESOURCE, "preferred_allocation": True, "delays": {"preferred_allocation_s": 1.0}}
    async with running_sim({"resources": [resource]}, tmp_path) as sim:
        await sim.initialize()
        preference = {"available": ["sim-a", "sim-b"], "size": 1}
        await sim.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "preferred_allocation",
                "params": {"resource": "example.com/sim", "containers": [preference]},
            }
        )
        await sim.send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "allocate",
                "params": {"resource": "example.com/sim", "containers": [{"device_ids": ["sim-a"]}]},
            }
        )
        first, second = await sim.receive(), await sim.receive()
        assert (first["id"], second["id"]) == (2, 1)
        assert "result" in first and "result" in second


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("list_devices", {"resource": 5}),
        ("list_devices", {"resource": "example.com/sim", "colour": "red"}),
        ("list_devices", ["example.com/sim"]),
        ("allocate", {"resource": "example.com/sim", "containers": "sim-a"}),
        ("preferred_allocation", {"resource": "example.com/sim", "containers": [{"size": "two"}]}),
    ],
    ids=["wrong-type", "unknown-field", "positional", "not-a-list", "not-a-number"],
)
async def test_params_that_do_not_fit_the_schema_are_invalid_params(
    tmp_path: Path, method: str, params: Any
) -> None:
    """Params are checked against the schema before the driver sees them: -32602 naming the method."""
    async with running_sim({"resources": [SIM_RESOURCE]}, tmp_path) as sim:
        await sim.initialize()
        response = await sim.request(1, method, params)
        assert response["error"]["code"] == -32602
        assert response["error"]["message"].startswith(f"invalid {method} params: ")


async def test_an_unknown_method_is_method_not_found(tmp_path: Path) -> None:
    """A method the protocol does not have is -32601, and the driver keeps serving."""
    async with running_sim({"resources": [SIM_RESOURCE]}, tmp_path) as sim:
        await sim.initialize()
        response = await sim.request(1, "reboot", {})
        assert response["error"] == {"code": -32601, "message": "unknown method 'reboot'"}
        assert "result" in await sim.request(2, "list_devices", {"resource": "example.com/sim"})


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("list_devices", {}),
        ("allocate", {"containers": [{"device_ids": ["sim-a"]}]}),
        ("prestart", {"device_ids": ["sim-a"]}),
    ],
    ids=["list_devices", "allocate", "prestart"],
)
async def test_an_unknown_resource_is_error_32003(
    tmp_path: Path, method: str, params: dict[str, Any]
) -> None:
    """A resource the driver does not serve is -32003 for every method, before any other check."""
    async with running_sim({"resources": [SIM_RESOURCE]}, tmp_path) as sim:
        await sim.initialize()
        response = await sim.request(1, method, {"resource": "example.com/other", **params})
        assert response["error"] == {"code": -32003, "message": "unknown resource 'example.com/other'"}


@pytest.mark.parametrize(
    ("version", "code"),
    [("2.0.0", -32600), ("0.9.0", -32600), ("one", -32602), ("1.4.2", None)],
    ids=["newer-major", "older-major", "not-semver", "same-major-other-minor"],
)
async def test_only_the_same_protocol_major_is_accepted_at_initialize(
    tmp_path: Path, version: str, code: int | None
) -> None:
    """Majors must be equal (docs/driver-protocol.md, "Lifecycle"): another major is -32600 with
    both versions in the message; a malformed version is -32602; another minor is fine."""
    async with running_sim({"resources": [SIM_RESOURCE]}, tmp_path) as sim:
        response = await sim.request(1, "initialize", {"protocol_version": version})
        if code is None:
            assert response["result"]["protocol_version"] == PROTOCOL_VERSION
        else:
            assert response["error"]["code"] == code
            assert version in response["error"]["message"]
        if code == -32600:
            assert PROTOCOL_VERSION in response["error"]["message"]


@pytest.mark.parametrize("version", ["1.0.0\n", "1.0.0-rc1\n", "\n1.0.0"])
def test_a_version_with_a_newline_is_not_semver(version: str) -> None:
    """A Python "$" matches before a final newline; the check must not."""
    with pytest.raises(InvalidParams, match="is not a semantic version"):
        check_protocol_version(version)


async def test_fifty_thousand_devices_with_declared_grants_are_listed_in_time(tmp_path: Path) -> None:
    """The SDK's fast encoding: 50,000 devices with declared grants come back, all of them, well
    inside devshim's 30 s list_devices deadline (about a second here; betterproto2's to_dict alone
    would take far longer)."""
    grant = {"envs": {"BIG": "{ids}"}, "mounts": [{"container_path": "/opt/big", "host_path": "/opt/big"}]}
    resource = {"name": "example.com/big", "count": 50_000, "grant_mode": "declared", "grant": grant}
    async with running_sim({"resources": [resource]}, tmp_path) as sim:
        await sim.initialize()
        start = time.perf_counter()
        response = await sim.request(1, "list_devices", {"resource": "example.com/big"})
        elapsed = time.perf_counter() - start
        devices = response["result"]["devices"]
        assert len(devices) == 50_000
        assert devices[-1] == {
            "id": "big-49999",
            "health": "HEALTHY",
            "grant": {
                "envs": {"BIG": "big-49999"},
                "mounts": [{"container_path": "/opt/big", "host_path": "/opt/big"}],
            },
        }
        assert elapsed < 10, f"listing took {elapsed:.1f} s"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (
            {"resources": [{"name": "example.com/x", "count": 1, "grant_mode": "sometimes"}]},
            "resources[0].grant_mode",
        ),
        ({"resources": [{"name": "example.com/x"}]}, "'count' or 'devices'"),
        ({"resources": [{"name": "x", "count": 1}]}, "resources[0].name"),
        ({"resources": [{"name": "example.com/x", "count": 1, "colour": "red"}]}, "resources[0].colour"),
        ({"resources": [{"name": "example.com/x", "count": 1, "delays": {"allocate_s": -1}}]}, "allocate_s"),
    ],
    ids=["bad-grant-mode", "no-devices", "bad-name", "unknown-key", "negative-delay"],
)
def test_an_invalid_simulator_config_exits_2_naming_the_field(config: dict[str, Any], field: str) -> None:
    """A config the simulator cannot use stops it at once with status 2 and a message naming
    the offending field, instead of a traceback or a driver that half works."""
    result = subprocess.run(
        [*SIM, "--config-json", json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    assert result.returncode == 2, result.stderr
    assert field in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreadable_simulator_config_file_exits_2(tmp_path: Path) -> None:
    """A config file that is missing or not YAML is the same clean exit 2 naming the file."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("resources: [\n")
    for path in (broken, tmp_path / "missing.yaml"):
        result = subprocess.run(
            [*SIM, "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
        )
        assert result.returncode == 2, result.stderr
        assert str(path) in result.stderr and "Traceback" not in result.stderr


async def test_the_driver_exits_0_when_devshim_closes_its_stdin(tmp_path: Path) -> None:
    """devshim going away (stdin closed without shutdown) ends the driver cleanly, not with an error."""
    async with running_sim({"resources": [SIM_RESOURCE]}, tmp_path) as sim:
        await sim.initialize()
        async with asyncio.timeout(10):
            status = await sim.finish()
        assert status == 0, sim.stderr


def test_the_python_example_is_the_one_in_the_doc() -> None:
    """adapters/examples/python_minimal.py is the code the doc shows, character for character."""
    doc = (ROOT / "docs" / "driver-protocol.md").read_text(encoding="utf-8")
    shown = doc.split("```python\n", 1)[1].split("```", 1)[0]
    assert (ROOT / "adapters" / "examples" / "python_minimal.py").read_text(encoding="utf-8") == shown


async def test_the_python_example_serves_its_fans() -> None:
    """The doc's minimal driver is a working program: it initializes, lists four fans and
    allocates them per container."""
    fans = await DriverProcess.start(
        sys.executable, str(ROOT / "adapters" / "examples" / "python_minimal.py")
    )
    try:
        result = (await fans.initialize())["result"]
        assert result["driver"]["name"] == "fans" and result["resources"] == [{"name": "example.com/fan"}]
        listed = await fans.request(1, "list_devices", {"resource": "example.com/fan"})
        assert [d["id"] for d in listed["result"]["devices"]] == ["fan0", "fan1", "fan2", "fan3"]
        containers = [{"device_ids": ["fan0", "fan2"]}, {"device_ids": ["fan1"]}]
        granted = await fans.request(2, "allocate", {"resource": "example.com/fan", "containers": containers})
        assert granted["result"] == {
            "containers": [{"envs": {"FANS": "fan0,fan2"}}, {"envs": {"FANS": "fan1"}}]
        }
        assert await fans.finish() == 0, fans.stderr
    finally:
        await fans.kill()


PRINTING_DRIVER = """
from shim.sdk import Driver, run, types

class Chatty(Driver):
    def resources(self):
        return [types.Resource(name="example.com/chatty")]

    async def list_devices(self, resource):
        print("listing devices now")
        return [types.Device(id="c0")]

run(Chatty())
"""


async def test_a_print_in_driver_code_goes_to_stderr_not_into_the_protocol() -> None:
    """stdout is the protocol: run() sends a stray print() to stderr, so the answer stays valid."""
    chatty = await DriverProcess.start(sys.executable, "-c", PRINTING_DRIVER)
    try:
        await chatty.initialize()
        listed = await chatty.request(1, "list_devices", {"resource": "example.com/chatty"})
        assert listed["result"] == {"devices": [{"id": "c0"}]}
        assert await chatty.finish() == 0
        assert "listing devices now" in chatty.stderr
    finally:
        await chatty.kill()


INITIALIZE_AND_SHUTDOWN = (
    b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocol_version":"1.0.0"}}\n'
    b'{"jsonrpc":"2.0","id":2,"method":"shutdown","params":{}}\n'
)
MINIMAL = [sys.executable, str(ROOT / "adapters" / "examples" / "python_minimal.py")]


def assert_initialized_and_shut_down(output: bytes) -> None:
    answers = {m["id"]: m for m in map(json.loads, output.splitlines())}
    assert answers[1]["result"]["driver"]["name"] == "fans"
    assert answers[1]["result"]["resources"] == [{"name": "example.com/fan"}]
    assert answers[2] == {"jsonrpc": "2.0", "id": 2, "result": {}}
    assert len(answers) == 2


@pytest.mark.parametrize(
    ("stdin_file", "stdout_file"),
    [(True, True), (True, False), (False, True)],
    ids=["both", "stdin", "stdout"],
)
def test_run_serves_stdin_and_stdout_that_are_regular_files(
    tmp_path: Path, stdin_file: bool, stdout_file: bool
) -> None:
    """`python driver.py < requests > answers`, by hand or under a supervisor logging to a file:
    asyncio's pipe transports refuse regular files, run() does not. The driver answers into the
    file and exits 0 at the end of its input."""
    requests, answers = tmp_path / "requests.jsonl", tmp_path / "answers.jsonl"
    requests.write_bytes(INITIALIZE_AND_SHUTDOWN)
    with requests.open("rb") as given, answers.open("wb") as taken:
        feed: dict[str, Any] = {"stdin": given} if stdin_file else {"input": INITIALIZE_AND_SHUTDOWN}
        done = subprocess.run(
            MINIMAL, **feed, stdout=taken if stdout_file else subprocess.PIPE, stderr=subprocess.PIPE,
            timeout=30, cwd=ROOT,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert_initialized_and_shut_down(answers.read_bytes() if stdout_file else done.stdout)


def test_run_with_stdin_at_dev_null_ends_cleanly(tmp_path: Path) -> None:
    """/dev/null is a character device epoll refuses: read directly, it is an empty input, so the
    driver has nothing to answer and exits 0."""
    answers = tmp_path / "answers.jsonl"
    with answers.open("wb") as taken:
        done = subprocess.run(
            MINIMAL, stdin=subprocess.DEVNULL, stdout=taken, stderr=subprocess.PIPE, timeout=30, cwd=ROOT
        )
    assert done.returncode == 0, done.stderr.decode()
    assert answers.read_bytes() == b"" and b"Traceback" not in done.stderr


def test_run_serves_a_terminal(tmp_path: Path) -> None:
    """A driver run by hand in a terminal: stdin and stdout one tty, answered line by line."""
    controller, terminal = os.openpty()
    tty.setraw(terminal)  # no echo and no CRLF: the terminal passes the lines as they are
    with (tmp_path / "stderr").open("wb") as stderr:
        driver = subprocess.Popen(MINIMAL, stdin=terminal, stdout=terminal, stderr=stderr, cwd=ROOT)
    os.close(terminal)
    try:
        os.write(controller, INITIALIZE_AND_SHUTDOWN)
        output = b""
        deadline = time.monotonic() + 30
        while output.count(b"\n") < 2 and time.monotonic() < deadline:
            if select.select([controller], [], [], 1)[0]:
                output += os.read(controller, 65536)
        assert_initialized_and_shut_down(output)
        assert driver.wait(timeout=30) == 0, (tmp_path / "stderr").read_text()
    finally:
        driver.kill()
        driver.wait()
        os.close(controller)


OVERRIDING_DRIVER = """
import sys
from shim.sdk import Driver, run, types

class Overrider(Driver):
    def resources(self):
        flags = [flag for flag in sys.argv[1].split(",") if flag]
        return [types.Resource(name="example.com/o", **dict.fromkeys(flags, True))]

    async def list_devices(self, resource):
        return []

    async def preferred_allocation(self, resource, request):
        return []

    async def prestart(self, resource, device_ids):
        pass

    async def deallocate(self, resource, device_ids):
        pass

    async def post_stop(self, resource, device_ids):
        pass

run(Overrider())
"""
OPTIONAL = ["preferred_allocation", "prestart", "deallocate", "post_stop"]


@pytest.mark.parametrize("declared", [[], ["prestart", "post_stop"], OPTIONAL], ids=["none", "some", "all"])
async def test_an_override_without_its_capability_flag_is_warned_about_on_stderr(declared: list[str]) -> None:
    """devshim never calls an optional method whose flag no resource sets: at initialize the SDK
    writes one warning per such override to stderr, naming the method and the flag, and changes
    no flag itself."""
    driver = await DriverProcess.start(sys.executable, "-c", OVERRIDING_DRIVER, ",".join(declared))
    try:
        result = (await driver.initialize())["result"]
        assert result["resources"] == [{"name": "example.com/o", **dict.fromkeys(declared, True)}]
        assert await driver.finish() == 0
    finally:
        await driver.kill()
    warnings = [line for line in driver.stderr.splitlines() if "overrides" in line]
    assert warnings == [
        f"WARNING: Overrider overrides {method} but no resource in resources() sets {method}=True: "
        "devshim will never call it"
        for method in OPTIONAL
        if method not in declared
    ]

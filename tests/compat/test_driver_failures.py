"""Misbehaving drivers behind devshim, seen from the fake kubelet.

Each test runs devshim in-process with one scripted driver (tests/support/drivers/flaky.py
on the SDK, flaky_raw.py writing raw JSON lines) that misbehaves in its first run(s)
and behaves after devshim restarts it, next to a static resource that must keep being
served whatever the driver does. The kubelet side is what is asserted: gRPC status codes
and details, the health in each list, registrations.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.compat.fakekubelet.records import HEALTHY, UNHEALTHY, DeviceState
from shim.driverhost import DriverHost
from shim.driverhost.limits import MAX_MESSAGE_BYTES
from shim.settings import Settings
from tests.support import DRIVERS
from tests.support.devshim_process import runs
from tests.support.shim_fixtures import logged

DRIVERS = DRIVERS
SDK_DRIVER = DRIVERS / "flaky.py"
RAW_DRIVER = DRIVERS / "flaky_raw.py"
FLAKY = "example.com/flaky"
STEADY = "example.com/steady"
DEVICES = ("f-0", "f-1")
# Generous bounds for a busy 2-core machine; a healthy run takes a fraction of each.
WAIT_S = 20.0

DeviceList = tuple[DeviceState, ...]


def listed(ids: Sequence[str], health: str) -> Callable[[DeviceList], bool]:
    """A list of exactly ``ids``, in order, every one with ``health``."""
    return lambda devices: [d.id for d in devices] == list(ids) and all(d.health == health for d in devices)


@dataclass
class Running:
    kubelet: FakeKubelet
    shim: Shim
    run_file: Path

    @property
    def host(self) -> DriverHost:
        return self.shim.drivers[0]

    def runs(self) -> list[int]:
        """The PIDs of the driver's runs so far, in order (each run records itself)."""
        if not self.run_file.exists():
            return []
        lines = self.run_file.read_text().splitlines()
        return [int(line.split()[1]) for line in lines if line.startswith("start ")]

    def signal_driver(self, signum: signal.Signals) -> None:
        process = self.host.process
        assert process is not None and process.returncode is None
        os.kill(process.pid, signum)

    async def flaky(self) -> PluginSession:
        return await self.kubelet.wait_for_plugin(FLAKY, timeout=WAIT_S)

    async def assert_steady_served(self) -> None:
        """The static resource was registered once, its stream never ended, and Allocate works."""
        steady = await self.kubelet.wait_for_plugin(STEADY, timeout=WAIT_S)
        assert not steady.stream_ended.is_set(), steady.stream_error
        assert [r.resource_name for r in self.kubelet.registrations if r.ok].count(STEADY) == 1
        assert listed(["dev0"], HEALTHY)(steady.latest)
        assert (await steady.allocate(["dev0"])).envs == {"STEADY": "dev0"}

    async def down_for_good(self) -> None:
        """Until the supervisor has given up on the driver."""
        async with asyncio.timeout(WAIT_S):
            await self.host.gave_up.wait()


def settings_for(
    plugin_dir: Path,
    state_dir: Path,
    program: Path,
    env: dict[str, str],
    *,
    timeouts: dict[str, float] | None = None,
    restart: dict[str, Any] | None = None,
) -> Settings:
    return Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        resources=[{"name": STEADY, "static": {"count": 1, "grant": {"envs": {"STEADY": "{ids}"}}}}],
        drivers=[
            {
                "name": "flaky",
                "user": "root",
                "command": [sys.executable, str(program)],
                "env": env,
                "resources": [FLAKY],
                "policy": {"envs": ["FLAKY"]},
                "timeouts": timeouts or {},
                "restart": {"backoff_initial_s": 0.05, **(restart or {})},
            }
        ],
    )


@asynccontextmanager
async def devshim(
    plugin_dir: Path,
    state_dir: Path,
    run_file: Path,
    program: Path = SDK_DRIVER,
    *,
    timeouts: dict[str, float] | None = None,
    restart: dict[str, Any] | None = None,
    **env: str,
) -> AsyncIterator[Running]:
    """devshim serving the static resource and ``program`` as driver 'flaky', with ``env``."""
    settings = settings_for(
        plugin_dir, state_dir, program, {"RUN_FILE": str(run_file), **env}, timeouts=timeouts, restart=restart
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings) as shim:
        yield Running(kubelet, shim, run_file)


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def devshim_errors() -> Iterator[list[str]]:
    """devshim's ERROR log messages during the test (where a driver failure's reason is told)."""
    with logged("ERROR") as messages:
        yield messages


async def healthy_session(running: Running, ids: Sequence[str] = DEVICES) -> PluginSession:
    flaky = await running.flaky()
    await flaky.wait_for_list(listed(ids, HEALTHY), timeout=WAIT_S)
    return flaky


async def outage_and_recovery(
    flaky: PluginSession, since: int, started: float, up: Sequence[str] = DEVICES
) -> tuple[float, float]:
    """Wait until the lists received since index ``since`` hold one with every device Unhealthy,
    then a later one with ``up`` all Healthy; the seconds from ``started`` to each.

    It reads the whole history rather than only the newest list, so a list that arrived before
    the wait began is not missed.
    """

    def down_at() -> int | None:
        history = flaky.lists[since:]
        return next((i for i, ds in enumerate(history) if listed(DEVICES, UNHEALTHY)(ds)), None)

    await flaky.wait_for_list(lambda _: down_at() is not None, timeout=WAIT_S)
    to_unhealthy = time.monotonic() - started

    def recovered() -> bool:
        first_down = down_at()
        assert first_down is not None
        return any(listed(up, HEALTHY)(ds) for ds in flaky.lists[since + first_down + 1 :])

    await flaky.wait_for_list(lambda _: recovered(), timeout=WAIT_S)
    to_healthy = time.monotonic() - started
    print(f"[figures] to Unhealthy list {to_unhealthy:.3f} s, to Healthy again {to_healthy:.3f} s")
    return to_unhealthy, to_healthy


def assert_never_missing(flaky: PluginSession, ids: Sequence[str] = DEVICES) -> None:
    """Every list the kubelet received named every device: a device missing from a list is
    removed from the node."""
    assert all([d.id for d in devices] == list(ids) for devices in flaky.lists), flaky.lists


def registrations(kubelet: FakeKubelet, resource: str) -> int:
    return sum(r.resource_name == resource and r.ok for r in kubelet.registrations)


# --- the driver does not start --------------------------------------------------------------


async def test_a_driver_that_always_exits_during_initialize_stays_down_and_is_never_registered(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """After max_start_failures failed starts devshim gives up on the driver: its status says
    down and why, nothing of it was ever registered, and the static resource is served."""
    async with devshim(
        plugin_dir,
        state_dir,
        run_file,
        restart={"max_start_failures": 3},
        FLAKY_MISBEHAVE="exit_on_initialize",
        FLAKY_BAD_RUNS="all",
    ) as running:
        await running.down_for_good()
        assert running.host.status.startswith("down:"), running.host.status
        assert "exited with code 3" in running.host.status
        assert len(running.runs()) == 3
        assert registrations(running.kubelet, FLAKY) == 0
        assert FLAKY not in running.shim.served
        await running.assert_steady_served()


async def test_a_driver_down_from_the_start_lists_its_saved_devices_as_unhealthy(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """With the inventory a previous run saved, a driver that never starts still has every
    device listed, as Unhealthy (never missing), and Allocate of one fails UNAVAILABLE."""
    async with devshim(plugin_dir, state_dir, run_file) as running:
        flaky = await healthy_session(running)
        assert (await flaky.allocate(["f-1"])).envs == {"FLAKY": "f-1"}

    async with devshim(
        plugin_dir,
        state_dir,
        run_file,
        restart={"max_start_failures": 3, "call_wait_s": 0.3},
        FLAKY_MISBEHAVE="exit_on_initialize",
        FLAKY_BAD_RUNS="all",
    ) as running:
        flaky = await running.flaky()
        await flaky.wait_for_list(listed(DEVICES, UNHEALTHY), timeout=WAIT_S)
        await running.down_for_good()
        assert running.host.status.startswith("down:"), running.host.status
        assert len(running.runs()) == 1 + 3
        assert listed(DEVICES, UNHEALTHY)(flaky.latest)
        assert all(listed(DEVICES, UNHEALTHY)(devices) for devices in flaky.lists), flaky.lists
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await flaky.allocate(["f-0"])
        assert failure.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "not running" in (failure.value.details() or "")
        await running.assert_steady_served()


# --- the driver fails while serving -----------------------------------------------------------


async def test_a_driver_dying_mid_allocate_fails_the_call_as_unavailable_and_comes_back(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """The kubelet's Allocate fails UNAVAILABLE naming the driver and its exit; the devices
    are listed Unhealthy, then Healthy once devshim restarted it, and Allocate works again."""
    async with devshim(plugin_dir, state_dir, run_file, FLAKY_MISBEHAVE="exit_on_allocate") as running:
        flaky = await healthy_session(running)
        since = len(flaky.lists)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await flaky.allocate(["f-0"])
        print(f"[figures] Allocate failed after {time.monotonic() - started:.3f} s")
        assert failure.value.code() is grpc.StatusCode.UNAVAILABLE
        details = failure.value.details() or ""
        assert "driver 'flaky'" in details and "exited with code 4" in details, details
        await outage_and_recovery(flaky, since, started)
        assert (await flaky.allocate(["f-0"])).envs == {"FLAKY": "f-0"}
        assert len(running.runs()) == 2
        assert_never_missing(flaky)
        assert registrations(running.kubelet, FLAKY) == 1
        await running.assert_steady_served()


async def test_a_driver_hanging_on_allocate_fails_the_call_with_a_deadline_and_is_restarted(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """A driver silent past timeouts.allocate_s makes Allocate fail DEADLINE_EXCEEDED; it is
    treated as hung: restarted, its devices Unhealthy until then and Healthy after."""
    async with devshim(
        plugin_dir, state_dir, run_file, timeouts={"allocate_s": 1}, FLAKY_MISBEHAVE="hang_on_allocate"
    ) as running:
        flaky = await healthy_session(running)
        since = len(flaky.lists)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await flaky.allocate(["f-0"])
        waited = time.monotonic() - started
        assert failure.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        details = failure.value.details() or ""
        assert "driver 'flaky'" in details and "did not answer allocate within 1 s" in details, details
        assert 0.9 <= waited < 8, waited
        await outage_and_recovery(flaky, since, started)
        assert (await flaky.allocate(["f-1"])).envs == {"FLAKY": "f-1"}
        assert len(running.runs()) == 2
        assert_never_missing(flaky)
        await running.assert_steady_served()


@pytest.mark.parametrize(
    ("misbehaviour", "reason"),
    [
        (
            "garbage",
            "it broke the protocol: not JSON: invalid literal, expected 'true': line 1 column 1 (char 0): "
            'the line began "this is not JSON {" (stdout carries protocol messages only: log to stderr)',
        ),
        ("unknown_id", "it broke the protocol: a response to unknown request id 424242"),
        # devshim reads a driver's messages up to its own bound, below the framing's 32 MiB.
        ("oversized", f"it broke the protocol: a message is longer than the {MAX_MESSAGE_BYTES}-byte limit"),
        ("close_stdout", "it closed its output but kept running"),
    ],
)
async def test_a_driver_breaking_the_protocol_on_stdout_is_restarted_and_its_devices_return(
    plugin_dir: Path,
    state_dir: Path,
    run_file: Path,
    devshim_errors: list[str],
    misbehaviour: str,
    reason: str,
) -> None:
    """A line that is not JSON, a response to a request never sent, a line over 32 MiB, or
    closing stdout while running on marks the devices Unhealthy; devshim restarts the driver
    and they return Healthy."""
    async with devshim(plugin_dir, state_dir, run_file, RAW_DRIVER, RAW_MISBEHAVE=misbehaviour) as running:
        flaky = await healthy_session(running)
        since = len(flaky.lists)
        started = time.monotonic()
        running.signal_driver(signal.SIGUSR1)
        await outage_and_recovery(flaky, since, started)
        assert any(f"driver 'flaky' failed: {reason}" in m for m in devshim_errors), devshim_errors
        assert len(running.runs()) == 2
        assert (await flaky.allocate(["f-0", "f-1"])).envs == {"FLAKY": "f-0,f-1"}
        assert_never_missing(flaky)
        await running.assert_steady_served()


async def test_a_driver_flooding_notifications_is_restarted_and_its_devices_return(
    plugin_dir: Path, state_dir: Path, run_file: Path, devshim_errors: list[str]
) -> None:
    """5000 log notifications at once, past restart.max_notifications_per_s, count as a failure:
    the devices are Unhealthy until the restarted driver lists them Healthy."""
    async with devshim(
        plugin_dir,
        state_dir,
        run_file,
        restart={"max_notifications_per_s": 100},
        FLAKY_MISBEHAVE="flood_on_signal",
    ) as running:
        flaky = await healthy_session(running)
        since = len(flaky.lists)
        started = time.monotonic()
        running.signal_driver(signal.SIGUSR1)
        await outage_and_recovery(flaky, since, started)
        flooded = "driver 'flaky' failed: it flooded devshim with more than 100 notifications in one second"
        assert any(flooded in m for m in devshim_errors), devshim_errors
        assert len(running.runs()) == 2
        assert (await flaky.allocate(["f-0"])).envs == {"FLAKY": "f-0"}
        assert_never_missing(flaky)
        await running.assert_steady_served()


async def test_a_driver_restarting_with_other_devices_has_the_kubelet_list_the_new_ones(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """The outage lists the old devices Unhealthy; the restarted driver's own list, with a
    device gone and one new, is the next Healthy list, and the resource is not re-registered."""
    async with devshim(
        plugin_dir, state_dir, run_file, FLAKY_MISBEHAVE="exit_on_signal", FLAKY_LATER_DEVICES="f-1,f-2"
    ) as running:
        flaky = await healthy_session(running)
        since = len(flaky.lists)
        started = time.monotonic()
        running.signal_driver(signal.SIGUSR1)
        await outage_and_recovery(flaky, since, started, up=("f-1", "f-2"))
        healthy = [ds for ds in flaky.lists[since:] if all(d.healthy for d in ds)]
        assert [[d.id for d in ds] for ds in healthy][:1] == [["f-1", "f-2"]]
        assert (await flaky.allocate(["f-2"])).envs == {"FLAKY": "f-2"}
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await flaky.allocate(["f-0"])
        assert failure.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "'f-0'" in (failure.value.details() or "")
        assert registrations(running.kubelet, FLAKY) == 1
        await running.assert_steady_served()


async def test_a_preference_answered_after_its_deadline_does_not_count_as_a_broken_driver(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """preferred_allocation past its deadline is dropped without restarting the driver; the
    answer that still comes later, for a request devshim gave up on, must not be taken for a
    response to an id devshim never used: the driver keeps serving, its devices stay Healthy."""
    async with devshim(
        plugin_dir,
        state_dir,
        run_file,
        RAW_DRIVER,
        timeouts={"preferred_allocation_s": 0.3},
        restart={"call_wait_s": 0},
        RAW_MISBEHAVE="late_preference",
    ) as running:
        flaky = await healthy_session(running)
        since = len(flaky.lists)
        process = running.host.process
        assert await flaky.preferred_allocation(list(DEVICES), ["f-1"], 1) == ["f-1"]
        # The driver answers the preference late, then this Allocate, in this order.
        assert (await flaky.allocate(["f-0"])).envs == {"FLAKY": "f-0"}
        assert running.host.process is process and running.host.status == "up", running.host.status
        assert (await flaky.allocate(["f-1"])).envs == {"FLAKY": "f-1"}
        assert flaky.lists[since:] == [], flaky.lists[since:]
        assert len(running.runs()) == 1
        await running.assert_steady_served()


# --- calls while the driver is away ------------------------------------------------------------


async def test_an_allocate_during_a_restart_waits_for_the_driver_and_succeeds(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """The kubelet chose f-0 while it was Healthy; its Allocate arrives during the outage, waits
    (restart.call_wait_s) for the restarted driver, slow to initialize, and gets its grant."""
    async with devshim(
        plugin_dir,
        state_dir,
        run_file,
        restart={"call_wait_s": 10},
        FLAKY_MISBEHAVE="exit_on_signal",
        FLAKY_LATER_INIT_DELAY_S="1",
    ) as running:
        flaky = await healthy_session(running)
        running.signal_driver(signal.SIGUSR1)
        await flaky.wait_for_list(listed(DEVICES, UNHEALTHY), timeout=WAIT_S)
        assert not running.host.status.startswith("up"), running.host.status
        started = time.monotonic()
        grant = await flaky.allocate(["f-0"])
        waited = time.monotonic() - started
        print(f"[figures] Allocate during a restart (1 s initialize) answered after {waited:.3f} s")
        assert grant.envs == {"FLAKY": "f-0"}
        assert len(running.runs()) == 2
        await flaky.wait_for_list(listed(DEVICES, HEALTHY), timeout=WAIT_S)
        await running.assert_steady_served()


async def test_an_allocate_during_a_long_outage_fails_unavailable_after_call_wait_s(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """With a restarted driver that takes a minute to initialize, an Allocate waits only
    restart.call_wait_s, then fails UNAVAILABLE saying the driver is not running."""
    async with devshim(
        plugin_dir,
        state_dir,
        run_file,
        timeouts={"shutdown_s": 1},
        restart={"call_wait_s": 0.3},
        FLAKY_MISBEHAVE="exit_on_signal",
        FLAKY_LATER_INIT_DELAY_S="60",
    ) as running:
        flaky = await healthy_session(running)
        running.signal_driver(signal.SIGUSR1)
        await flaky.wait_for_list(listed(DEVICES, UNHEALTHY), timeout=WAIT_S)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await flaky.allocate(["f-0"])
        waited = time.monotonic() - started
        assert failure.value.code() is grpc.StatusCode.UNAVAILABLE
        details = failure.value.details() or ""
        assert "driver 'flaky'" in details and "not running" in details, details
        assert 0.25 <= waited < 5, waited
        assert listed(DEVICES, UNHEALTHY)(flaky.latest)
        await running.assert_steady_served()


async def test_a_failed_run_cannot_mark_its_devices_healthy_again_while_it_is_being_stopped(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """A driver hung past its allocate deadline is failed and stopped: stdin closed, SIGTERM a
    second later. A devices_changed it sends in between must not end the outage. Its restart
    fails, so the devices must still be Unhealthy once devshim gives up on it."""
    async with devshim(
        plugin_dir,
        state_dir,
        run_file,
        RAW_DRIVER,
        timeouts={"allocate_s": 1},
        restart={"max_start_failures": 1},
        RAW_MISBEHAVE="hang_on_allocate_relist_at_eof",
        RAW_LATER_MISBEHAVE="exit_on_initialize",
    ) as running:
        flaky = await healthy_session(running)
        since = len(flaky.lists)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await flaky.allocate(["f-0"])
        assert failure.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        await running.down_for_good()
        assert running.host.status.startswith("down:"), running.host.status
        assert len(running.runs()) == 2
        outage = flaky.lists[since:]
        assert outage and all(listed(DEVICES, UNHEALTHY)(devices) for devices in outage), outage
        await running.assert_steady_served()


# --- stopping ------------------------------------------------------------------------------------


async def test_leaving_devshim_sends_shutdown_to_a_running_driver(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """On devshim's stop a running driver gets the protocol's `shutdown` request (then its
    stdin closes), and a driver that answers it exits by itself."""
    async with devshim(plugin_dir, state_dir, run_file, RAW_DRIVER) as running:
        await healthy_session(running)
        process = running.host.process
        assert process is not None
    assert process.returncode == 0
    assert f"shutdown {process.pid}" in run_file.read_text().splitlines()


async def test_a_killed_driver_whose_child_holds_its_output_is_seen_dead_and_its_child_ended(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """A driver that started a child (which inherits its stdout, so the pipe stays open) is
    SIGKILLed: devshim sees the exit anyway, ends the child with it (its process group), shows
    the devices Unhealthy, and the restarted driver brings them back."""
    async with devshim(plugin_dir, state_dir, run_file, FLAKY_CHILD="1") as running:
        flaky = await healthy_session(running)
        lines = run_file.read_text().split()
        driver, child = int(lines[lines.index("start") + 1]), int(lines[lines.index("child") + 1])
        seen, started = len(flaky.lists), time.monotonic()
        os.kill(driver, signal.SIGKILL)
        await outage_and_recovery(flaky, seen, started)
        async with asyncio.timeout(WAIT_S):
            while runs(child):
                await asyncio.sleep(0.02)


async def test_a_driver_ignoring_shutdown_and_sigterm_is_killed_within_the_shutdown_bounds(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """Leaving devshim with a driver that never answers shutdown, ignores the end of its input
    and traps SIGTERM still finishes promptly (timeouts.shutdown_s per step), and the driver
    is gone afterwards: SIGTERM was tried, then SIGKILL, and the process was reaped."""
    async with devshim(
        plugin_dir, state_dir, run_file, RAW_DRIVER, timeouts={"shutdown_s": 0.5}, RAW_MISBEHAVE="stubborn"
    ) as running:
        flaky = await healthy_session(running)
        assert (await flaky.allocate(["f-0"])).envs == {"FLAKY": "f-0"}
        await running.assert_steady_served()
        process = running.host.process
        assert process is not None
        leaving = time.monotonic()
    took = time.monotonic() - leaving
    print(f"[figures] leaving devshim with a stubborn driver took {took:.3f} s")
    assert took < 6, took
    assert process.returncode == -signal.SIGKILL
    assert f"sigterm {process.pid}" in run_file.read_text().splitlines()
    assert not Path(f"/proc/{process.pid}").exists()


async def test_a_restarted_driver_is_told_which_allocations_are_in_use(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """initialize after a crash carries the devices devshim allocated before it, so the new run
    can rebuild its state; the first run was told nothing was in use."""
    async with devshim(plugin_dir, state_dir, run_file, FLAKY_MISBEHAVE="exit_on_signal") as running:
        flaky = await healthy_session(running)
        await flaky.allocate(["f-1"])
        since = len(flaky.lists)
        running.signal_driver(signal.SIGUSR1)
        await outage_and_recovery(flaky, since, time.perf_counter())
        told = [json.loads(line.split(" ", 1)[1]) for line in run_file.read_text().splitlines()
                if line.startswith("initialize ")]  # fmt: skip
    assert told == [[], [{"resource": FLAKY, "device_ids": ["f-1"]}]]


async def test_declared_grants_are_answered_while_the_driver_restarts(
    plugin_dir: Path, state_dir: Path, run_file: Path
) -> None:
    """A device that declared its grant and was Healthy a moment ago is allocated at once during
    the outage, without waiting for the (slow, 3 s) restart."""
    async with devshim(
        plugin_dir, state_dir, run_file,
        FLAKY_MISBEHAVE="exit_on_signal", FLAKY_DECLARED="1", FLAKY_LATER_INIT_DELAY_S="3",
    ) as running:  # fmt: skip
        flaky = await healthy_session(running)
        running.signal_driver(signal.SIGUSR1)
        await flaky.wait_for_list(listed(DEVICES, UNHEALTHY), timeout=WAIT_S)
        started = time.perf_counter()
        grant = await flaky.allocate(["f-0", "f-1"])
        assert time.perf_counter() - started < 1.5
        assert grant.envs == {"FLAKY": "f-0,f-1"}
        assert listed(DEVICES, UNHEALTHY)(flaky.latest), "answered before the driver was back"


async def test_failed_starts_are_counted_and_explained_while_devshim_still_retries(
    plugin_dir: Path, state_dir: Path
) -> None:
    """A driver that cannot start shows its failures and why in status at once, not only once
    devshim has given up on it."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        drivers=[{
            "name": "absent", "user": "root", "command": [str(state_dir / "no-such-driver")],
            "resources": ["example.com/absent"],
            "restart": {"max_start_failures": 1000, "backoff_initial_s": 0.01, "backoff_max_s": 0.05},
        }],
    )  # fmt: skip
    async with Shim(settings) as shim:
        async with asyncio.timeout(20):
            while shim.status()["drivers"]["absent"]["failures"] < 2:
                await asyncio.sleep(0.02)
        shown = shim.status()["drivers"]["absent"]
        assert not shim.drivers[0].gave_up.is_set()
        assert "no-such-driver" in shown["last_failure"], shown

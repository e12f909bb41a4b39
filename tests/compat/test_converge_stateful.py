"""After any sequence of restarts and changes, the kubelet acts on what the driver says (issue 42).

A search, not a test written for one bug: hypothesis drives events in random orders against a
real devshim process, its sim driver and the fake kubelet (which, like 1.25+ kubelets, reads a
plugin's options once per registration and keeps them for that connection), checks after every
step that the kubelet's view agrees with the driver's truth within WAIT_S, and shrinks a failure
to its shortest sequence. The invariants are those of docs/architecture.md, "Shared facts", for
the device plugin path:

- options: the kubelet's connection holds the optional calls the driver declares now;
- devices and health: the kubelet's newest list names the driver's devices, each with the health
  the driver gives it;
- never withdrawn: every list the kubelet got names every device (broken is Unhealthy, not gone),
  whatever restarted in between.

Events: a device's health changes; the driver is upgraded to declare other calls (it restarts);
the driver crashes; the kubelet restarts; devshim restarts, by SIGTERM or SIGKILL, with its state
folder or without it. CI runs 2 examples of up to 8 steps, derandomized (tests/fuzz/profiles.py);
by hand, ``HYPOTHESIS_PROFILE=long`` runs 50 times as many examples, at random, and
``DEVSHIM_CONVERGE_STEPS`` longer sequences, with pytest's ``--timeout 0`` (tests/README.md);
``DEVSHIM_CONVERGE_TALLY=FILE`` counts the steps run, by rule, into FILE.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import Coroutine
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from shim.compat.fakekubelet import FakeKubelet
from shim.model import Health
from tests.fuzz.profiles import examples
from tests.support import AS_ROOT
from tests.support.devshim_process import kill_children, start_devshim
from tests.support.tally import Tally
from tests.support.unix import short_temp_dir
from tests.support.waiting import until

T = TypeVar("T")
GPU = "example.com/conv"
IDS = ("conv-0", "conv-1", "conv-2")
WAIT_S = 30.0  # the stated time: every fact agrees again within it, on a busy 2-core machine
STEPS = int(os.environ.get("DEVSHIM_CONVERGE_STEPS", "8"))
tally = Tally()  # by hand, DEVSHIM_CONVERGE_TALLY=FILE counts the steps run


class Converge(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dirs = ExitStack()
        self.plugin_dir = self.dirs.enter_context(short_temp_dir("ds-conv-"))
        self.state_dir = self.dirs.enter_context(short_temp_dir("ds-conv-state-"))
        self.work = self.dirs.enter_context(short_temp_dir("ds-conv-work-"))
        self.control = self.work / "control"
        self.control.touch()
        # The driver's truth: what its config file says, which it reads at every start.
        self.healthy = dict.fromkeys(IDS, True)
        self.prestart = self.preferred = False
        self.checked: dict[int, int] = {}  # per session (by id): how many of its lists were checked
        self.devshim: asyncio.subprocess.Process | None = None
        self.kubelet = FakeKubelet(self.plugin_dir)
        self.run(self.kubelet.start())
        self.run(self.start_devshim())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        try:
            self.run(self.stop_devshim(signal.SIGTERM))
            self.run(self.kubelet.stop())
        finally:
            self.loop.close()
            self.dirs.close()

    # --- the driver's truth, and devshim -------------------------------------------------------

    def write_sim_config(self) -> Path:
        path = self.work / "sim.json"
        resource = {
            "name": GPU,
            "devices": [{"id": i, "healthy": self.healthy[i]} for i in IDS],
            "prestart": self.prestart,
            "preferred_allocation": self.preferred,
        }
        path.write_text(json.dumps({"resources": [resource], "control_file": str(self.control)}))
        return path

    async def start_devshim(self) -> None:
        driver = {
            "name": "sim",
            "command": [
                sys.executable,
                "-m",
                "devshim_adapters.sim",
                "--config",
                str(self.write_sim_config()),
            ],
            "resources": [GPU],
            "restart": {"backoff_max_s": 0.5},
            **AS_ROOT,
        }
        config = self.work / "devshim.json"
        config.write_text(
            json.dumps(
                {
                    "device_plugins_dir": str(self.plugin_dir),
                    "state_dir": str(self.state_dir),
                    "register_backoff_max_s": 0.5,
                    "drivers": [driver],
                }
            )
        )
        self.devshim = await start_devshim("run", "--config", str(config))

    async def stop_devshim(self, how: signal.Signals) -> None:
        proc, self.devshim = self.devshim, None
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(how)
        try:
            async with asyncio.timeout(WAIT_S):
                await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.communicate()
            raise AssertionError(f"devshim did not end within {WAIT_S:g} s of {how.name}") from None

    def kill_driver(self) -> None:
        assert self.devshim is not None
        kill_children(self.devshim.pid)

    # --- events ----------------------------------------------------------------------------

    @rule(device=st.sampled_from(IDS))
    def device_health_changes(self, device: str) -> None:
        tally("health change")
        self.healthy[device] = not self.healthy[device]
        self.write_sim_config()  # a restart keeps it; the running driver hears it now
        health = "Healthy" if self.healthy[device] else "Unhealthy"
        with self.control.open("a") as control:
            control.write(f"health {GPU} {device} {health}\n")

    @rule(prestart=st.booleans(), preferred=st.booleans())
    def driver_upgraded(self, prestart: bool, preferred: bool) -> None:
        tally("driver upgrade")
        self.prestart, self.preferred = prestart, preferred
        self.write_sim_config()
        self.kill_driver()

    @rule()
    def driver_crashes(self) -> None:
        tally("driver crash")
        self.kill_driver()

    @rule()
    def kubelet_restarts(self) -> None:
        tally("kubelet restart")
        self.run(self.kubelet.restart())

    @rule(killed=st.booleans(), state_kept=st.booleans())
    def devshim_restarts(self, killed: bool, state_kept: bool) -> None:
        tally("devshim restart")
        self.run(self.stop_devshim(signal.SIGKILL if killed else signal.SIGTERM))
        if not state_kept:
            shutil.rmtree(self.state_dir)
            self.state_dir.mkdir(mode=0o700)
        self.run(self.start_devshim())

    # --- what must hold after every step -------------------------------------------------------

    def agrees(self) -> bool:
        try:
            session = self.kubelet.plugin(GPU)
            latest = session.latest
        except (KeyError, LookupError):
            return False
        options = session.options
        return (
            not session.stream_ended.is_set()
            and options.pre_start_required == self.prestart
            and options.get_preferred_allocation_available == self.preferred
            and {d.id: d.health == Health.HEALTHY for d in latest} == self.healthy
        )

    @invariant()
    def the_kubelet_agrees_with_the_driver(self) -> None:
        what = f"the kubelet holds prestart={self.prestart} preferred={self.preferred} {self.healthy}"
        self.run(until(self.agrees, what, timeout=WAIT_S))

    @invariant()
    def no_device_was_ever_withdrawn(self) -> None:
        try:
            session = self.kubelet.plugin(GPU)
        except KeyError:
            return  # not registered since the kubelet restarted: what it holds is checked above
        seen = self.checked.get(id(session), 0)
        for n, devices in enumerate(session.lists[seen:], start=seen):
            assert {d.id for d in devices} == set(IDS), f"list {n} of {session}: {[d.id for d in devices]}"
        self.checked[id(session)] = len(session.lists)


def test_the_kubelet_converges_on_the_driver_after_any_events() -> None:
    run_state_machine_as_test(
        Converge,
        settings=settings(examples(ci=2), stateful_step_count=STEPS, suppress_health_check=list(HealthCheck)),
    )

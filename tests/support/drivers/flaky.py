"""An SDK driver that misbehaves on purpose in its first run(s), then behaves after a restart.

Serves ``example.com/flaky``, per-call allocate with the grant ``{"FLAKY": "<ids>"}``.
Its switches come from the environment (devshim passes exactly the configured ``env``):

RUN_FILE
    Required. Every run appends ``start <pid>`` to it, so a run knows its number
    and the test can count the restarts.
FLAKY_MISBEHAVE
    What a misbehaving run does:
    ``exit_on_initialize`` exits (code 3) when initialize arrives;
    ``exit_on_allocate`` exits (code 4) when allocate arrives;
    ``hang_on_allocate`` never answers allocate;
    ``exit_on_signal`` exits (code 5) on SIGUSR1;
    ``flood_on_signal`` sends FLAKY_FLOOD (default 5000) log notifications at once on SIGUSR1;
    ``none`` (the default) behaves.
FLAKY_BAD_RUNS
    How many first runs misbehave: a number (default 1) or ``all``.
FLAKY_DEVICES, FLAKY_LATER_DEVICES
    Comma-separated device IDs of a misbehaving run (default ``f-0,f-1``) and of a
    behaving run after it (default: the same).
FLAKY_LATER_INIT_DELAY_S
    Seconds a behaving run after a misbehaving one waits before answering initialize.
FLAKY_DECLARED
    ``1``: every device declares its grant at list time (``{"FLAKY": "<id>"}``).
FLAKY_CHILD
    ``1``: every run starts a child (``sleep``) that inherits its stdout, as a driver fronting
    other programs does, and appends ``child <pid>``; ``daemon``: the child leaves the driver's
    process group (a session of its own), as a daemon does.

Every run also appends ``initialize <allocations as JSON>`` when initialize arrives, so a
test can see what devshim told a restarted driver was in use.

The test sends SIGUSR1 only once the kubelet has seen this run's devices, so the
misbehaviour happens at a known moment rather than racing the first list.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from shim.sdk import Driver, run, types

RESOURCE = "example.com/flaky"


def start_run(run_file: Path) -> int:
    """Record this run; its number, counting from 1."""
    with run_file.open("a") as runs:
        runs.write(f"start {os.getpid()}\n")
    return sum(line.startswith("start ") for line in run_file.read_text().splitlines())


def exit_now(code: int, why: str) -> None:
    sys.stderr.write(f"flaky: {why}; exiting with code {code} on purpose\n")
    sys.stderr.flush()
    os._exit(code)


class Flaky(Driver):
    name = "flaky"

    def __init__(self) -> None:
        env = os.environ
        self.run_number = start_run(Path(env["RUN_FILE"]))
        bad_runs = env.get("FLAKY_BAD_RUNS", "1")
        self.bad = bad_runs == "all" or self.run_number <= int(bad_runs)
        self.later = not self.bad and self.run_number > 1
        self.mode = env.get("FLAKY_MISBEHAVE", "none") if self.bad else "none"
        first = env.get("FLAKY_DEVICES", "f-0,f-1")
        self.device_ids = (env.get("FLAKY_LATER_DEVICES", first) if self.later else first).split(",")
        self.init_delay_s = float(env.get("FLAKY_LATER_INIT_DELAY_S", "0")) if self.later else 0.0
        self.flood = int(env.get("FLAKY_FLOOD", "5000"))
        self.declared = env.get("FLAKY_DECLARED") == "1"
        self.run_file = Path(env["RUN_FILE"])
        self._flooding: asyncio.Task[None] | None = None
        if env.get("FLAKY_CHILD") in ("1", "daemon"):
            # A daemon leaves the driver's process group (a session of its own), so a group kill
            # misses it; either way stdout is the pipe to devshim.
            child = subprocess.Popen(["sleep", "600"], start_new_session=env["FLAKY_CHILD"] == "daemon")
            with self.run_file.open("a") as runs:
                runs.write(f"child {child.pid}\n")

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=RESOURCE)]

    async def on_initialize(self, params: types.InitializeParams) -> None:
        in_use = [{"resource": a.resource, "device_ids": list(a.device_ids)} for a in params.allocations]
        with self.run_file.open("a") as runs:
            runs.write(f"initialize {json.dumps(in_use)}\n")
        if self.mode == "exit_on_initialize":
            exit_now(3, f"run {self.run_number} got initialize")
        if self.mode == "exit_on_signal":
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGUSR1, exit_now, 5, f"run {self.run_number} got SIGUSR1"
            )
        if self.mode == "flood_on_signal":
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self._start_flood)
        if self.init_delay_s:
            await asyncio.sleep(self.init_delay_s)

    def _start_flood(self) -> None:
        self._flooding = asyncio.create_task(self._send_flood())

    async def _send_flood(self) -> None:
        for i in range(self.flood):
            await self.log("INFO", f"flood {i}")

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [
            types.Device(
                id=i,
                health=types.Health.HEALTHY,
                grant=types.Grant(envs={"FLAKY": i}) if self.declared else None,
            )
            for i in self.device_ids
        ]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        if self.mode == "exit_on_allocate":
            exit_now(4, f"run {self.run_number} got allocate")
        if self.mode == "hang_on_allocate":
            await asyncio.Event().wait()
        return [types.Grant(envs={"FLAKY": ",".join(ids)}) for ids in containers]


if __name__ == "__main__":
    run(Flaky())

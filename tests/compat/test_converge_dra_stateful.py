"""After any sequence of restarts, deletions and claims, the API server, the container runtime and
the kubelet hold what devshim's driver says (issue 42): the DRA rows of docs/architecture.md,
searched.

The device plugin rows have their search in test_converge_stateful.py; this is its DRA twin.
Hypothesis drives events in random orders against a real `devshim run` publishing one DRA pool
to a real kube-apiserver (with etcd) and answering NodePrepareResources and
NodeUnprepareResources over its DRA socket as the kubelet calls them (retried until they
succeed, as the kubelet retries), checks after every step that the shared facts agree within
WAIT_S, and shrinks a failure to its shortest sequence:

- ResourceSlices per pool: the node's slices are one complete generation naming exactly the
  driver's devices, each tainted exactly as the driver has it (from 1.36, where the API server
  keeps taints), and the generation never goes back (a scheduler takes the newest);
- CDI spec files: one per claim the kubelet holds prepared, none for any other claim;
- the DRA checkpoint: preparing a prepared claim again answers what the first prepare did;
- health: the kubelet's NodeWatchResources stream (kept open, opened again when it ends) last
  reported each device as the driver has it.

Events: the driver is upgraded to list other devices; a device's health or taint changes; a claim is
prepared or unprepared; the driver crashes; devshim restarts, by SIGTERM or SIGKILL, with its
state folder or without it; kube-apiserver restarts; someone deletes the node's slices. CI runs
3 examples of up to 6 steps against each end of the API server range, derandomized; by hand,
``HYPOTHESIS_PROFILE=long`` and ``DEVSHIM_CONVERGE_STEPS`` as in the device plugin search
(tests/README.md), ``DEVSHIM_CONVERGE_TALLY=FILE`` counting the steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
from collections.abc import Coroutine, Iterator
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from shim.compat.dra_world import Published, RunningDevshim, running_devshim
from shim.compat.realnode import ControlPlane
from shim.compat.realnode.apiserver import APIError
from tests.fuzz.profiles import examples
from tests.support import control_plane
from tests.support.devshim_process import kill_children
from tests.support.dra import SIM, make_claim
from tests.support.dra_calls import GPU, Devshim, prepare, spec_of, unprepare, watch_health
from tests.support.tally import Tally
from tests.support.unix import short_temp_dir
from tests.support.waiting import until

T = TypeVar("T")
RESOURCE = "example.com/gpu"
DEVICES = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")  # the driver lists the first 2 to 4
TAINT = {"key": "example.com/going-away", "effect": "NoSchedule"}
TAINTS_ON_BY_DEFAULT = 36  # DRADeviceTaints: beta and on in 1.36
CLAIMED = DEVICES[:2]  # the devices claims are allocated from: every list keeps them
WAIT_S = 30.0  # the stated time: every fact agrees again within it, on a busy 2-core machine
STEPS = int(os.environ.get("DEVSHIM_CONVERGE_STEPS", "6"))
NODES = itertools.count()  # a node per example: the API server outlives the examples
tally = Tally()

Answer = list[tuple[str, str, tuple[str, ...]]]  # (pool, device, CDI device IDs) per device


class ConvergeDra(RuleBasedStateMachine):
    plane: ClassVar[ControlPlane]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dirs = ExitStack()
        self.folder = self.dirs.enter_context(short_temp_dir("ds-cdra-"))
        self.node = f"node-cdra-{os.getpid()}-{next(NODES)}"
        self.version = control_plane.NEWEST_DRA[self.plane.minor]
        self.published = Published(self.plane, self.version, self.node, GPU)
        self.claims = {
            device: make_claim(
                self.plane, self.version, f"{self.node}-{device}", [("gpu", device)], node=self.node
            )
            for device in CLAIMED
        }
        # The truth: the driver's devices and their health, and what the kubelet holds prepared
        # (the answer it got).
        self.count = 3
        self.healthy = dict.fromkeys(DEVICES, True)
        self.tainted = dict.fromkeys(DEVICES, False)  # protocol 1.3's taint, published (1.36 on)
        self.prepared: dict[str, Answer] = {}
        self.forgotten: set[str] = set()  # prepared claims devshim lost its checkpoint of
        self.highest_generation = self.last_generation = 0
        self.running = AsyncExitStack()
        self.devshim: RunningDevshim | None = None
        self.run(self.start_devshim())
        self.heard: dict[str, str] = {}  # the health the kubelet's stream last reported
        self.health_stream = self.loop.create_task(watch_health(self.shim, self.heard))

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        try:
            self.health_stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                self.loop.run_until_complete(self.health_stream)
            self.run(self.running.aclose())
            self.delete_slices()  # stopped, devshim leaves them (a kubelet would delete them)
        finally:
            self.loop.close()
            self.dirs.close()

    # --- the driver's truth, and devshim -------------------------------------------------------

    def write_sim_config(self) -> Path:
        path = self.folder / "sim.yaml"
        resource = {
            "name": RESOURCE,
            "devices": [
                {"id": d, "healthy": self.healthy[d], "taints": [TAINT] if self.tainted[d] else []}
                for d in self.listed
            ],
            "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
        }
        path.write_text(
            yaml.safe_dump({"resources": [resource], "control_file": str(self.folder / "sim.ctl")})
        )
        return path

    def write_config(self) -> Path:
        (self.folder / "sim.ctl").touch()
        driver = {
            "name": "sim",
            "user": "root",
            "command": [*SIM, "--config", str(self.write_sim_config())],
            "resources": [RESOURCE],
            "policy": {"envs": ["SIM_DEVICES"]},
            "restart": {"backoff_max_s": 0.5},
        }
        settings = {
            "device_plugins_dir": str(self.folder / "dp"),
            "plugins_registry_dir": str(self.folder / "registry"),
            "state_dir": str(self.folder / "state"),
            "drivers": [driver],
            "dra": {
                "node_name": self.node,
                "kubeconfig": str(self.plane.admin_kubeconfig),
                "plugins_dir": str(self.folder / "plugins"),
                "cdi_dir": str(self.folder / "cdi"),
                "drivers": [{"name": GPU, "resources": [RESOURCE]}],
            },
        }
        path = self.folder / "devshim.yaml"
        path.write_text(yaml.safe_dump(settings))
        return path

    async def start_devshim(self) -> None:
        self.devshim = await self.running.enter_async_context(running_devshim(self.write_config()))

    async def stop_devshim(self, how: signal.Signals) -> None:
        assert self.devshim is not None
        if how is signal.SIGKILL and self.devshim.proc.returncode is None:
            self.devshim.proc.kill()
        await self.running.aclose()  # SIGTERM, or reaps the killed one
        self.running, self.devshim = AsyncExitStack(), None

    @property
    def shim(self) -> Devshim:
        assert self.devshim is not None
        return Devshim(self.folder, self.folder / "devshim.yaml", self.devshim.port, self.devshim.proc)

    async def as_the_kubelet(self, prepares: bool, device: str) -> Any:
        """NodePrepareResources (or NodeUnprepareResources) for the claim on `device`, retried, as
        the kubelet retries, until its answer has no error, or, for a prepare of a device the
        driver has Unhealthy, says so (None); AssertionError after WAIT_S."""
        claim = self.claims[device]
        uid, last = claim["metadata"]["uid"], ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while loop.time() < deadline:
            try:
                if prepares:
                    answer = (await prepare(self.shim, [claim]))[uid]
                    if not (last := answer.error):
                        return [(d.pool_name, d.device_name, tuple(d.cdi_device_ids)) for d in answer.devices]
                    if not self.healthy[device] and f"'{device}' is Unhealthy" in last:
                        return None
                elif not (last := (await unprepare(self.shim, [claim]))[uid]):
                    return None
            except grpc.aio.AioRpcError as exc:  # devshim not (yet) serving: the kubelet retries
                last = f"{exc.code().name}: {exc.details()}"
            await asyncio.sleep(0.2)
        call = "NodePrepareResources" if prepares else "NodeUnprepareResources"
        raise AssertionError(f"{call} of the claim on {device}: still failing after {WAIT_S:g} s: {last}")

    def kill_driver(self) -> None:
        assert self.devshim is not None
        kill_children(self.devshim.proc.pid)

    # --- events ----------------------------------------------------------------------------

    @property
    def listed(self) -> list[str]:
        return list(DEVICES[: self.count])

    @rule(count=st.integers(len(CLAIMED), len(DEVICES)))
    def the_driver_is_upgraded_to_list(self, count: int) -> None:
        tally("driver lists other devices")
        self.count = count
        self.write_sim_config()
        self.kill_driver()  # it starts again with the new list

    @rule(device=st.sampled_from(DEVICES))
    def a_device_health_changes(self, device: str) -> None:
        tally("health change")
        self.healthy[device] = not self.healthy[device]
        self.write_sim_config()  # a restart keeps it; the running driver hears it now
        health = "Healthy" if self.healthy[device] else "Unhealthy"
        if device in self.listed:
            with (self.folder / "sim.ctl").open("a") as control:
                control.write(f"health {RESOURCE} {device} {health}\n")

    @rule(device=st.sampled_from(DEVICES))
    def a_device_taint_changes(self, device: str) -> None:
        tally("taint change")
        self.tainted[device] = not self.tainted[device]
        self.write_sim_config()
        if device in self.listed:
            command = f"taint {RESOURCE} {device} {TAINT['key']} {TAINT['effect']}"
            with (self.folder / "sim.ctl").open("a") as control:
                control.write((command if self.tainted[device] else f"untaint {RESOURCE} {device}") + "\n")

    @rule(device=st.sampled_from(CLAIMED))
    def a_claim_is_prepared(self, device: str) -> None:
        tally("prepare")
        answer = self.run(self.as_the_kubelet(True, device))
        if answer is None:  # refused, the device being Unhealthy: right unless devshim knows the claim
            assert device not in self.prepared or device in self.forgotten, (
                f"the claim on {device}, prepared before, was refused: the checkpoint must answer it"
            )
            return
        first = self.prepared.setdefault(device, answer)
        self.forgotten.discard(device)
        assert answer == first, f"the claim on {device} was prepared as {first}, now answered {answer}"

    @rule(device=st.sampled_from(CLAIMED))
    def a_claim_is_unprepared(self, device: str) -> None:
        tally("unprepare")
        self.run(self.as_the_kubelet(False, device))
        self.prepared.pop(device, None)
        self.forgotten.discard(device)

    @rule()
    def the_driver_crashes(self) -> None:
        tally("driver crash")
        self.kill_driver()

    @rule(killed=st.booleans(), state_kept=st.booleans())
    def devshim_restarts(self, killed: bool, state_kept: bool) -> None:
        tally("devshim restart")
        self.run(self.stop_devshim(signal.SIGKILL if killed else signal.SIGTERM))
        if not state_kept:
            shutil.rmtree(self.folder / "state", ignore_errors=True)
            self.forgotten |= set(self.prepared)  # the kubelet holds them prepared; devshim forgot
        self.run(self.start_devshim())

    @rule()
    def the_api_server_restarts(self) -> None:
        tally("API server restart")
        self.plane.restart()

    @rule()
    def someone_deletes_the_slices(self) -> None:
        tally("slices deleted")
        self.delete_slices()

    def delete_slices(self) -> None:
        for item in self.published.slices():
            with contextlib.suppress(APIError):  # deleted meanwhile
                path = f"/apis/resource.k8s.io/{self.version}/resourceslices/{item['metadata']['name']}"
                self.plane.request("DELETE", path)

    # --- what must hold after every step -------------------------------------------------------

    def pool_agrees(self) -> bool:
        slices = self.published.slices()
        if not slices:
            return False
        generations = {s["spec"]["pool"]["generation"] for s in slices}
        if len(generations) != 1 or len(slices) != slices[0]["spec"]["pool"]["resourceSliceCount"]:
            return False
        devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
        self.last_generation = generations.pop()
        if sorted(devices) != self.listed:
            return False
        # Each device's taint as the driver has it, also while devshim serves it from its inventory.
        taints = {n: [{k: v for k, v in t.items() if k != "timeAdded"} for t in d.get("taints", [])]
                  for n, d in devices.items()}  # fmt: skip
        shown = self.plane.minor >= TAINTS_ON_BY_DEFAULT  # before, the API server drops them
        return all(taints[d] == ([TAINT] if self.tainted[d] and shown else []) for d in self.listed)

    @invariant()
    def the_api_server_holds_the_pool(self) -> None:
        what = f"the node's slices are one generation of {', '.join(self.listed)}"
        self.run(until(self.pool_agrees, what, timeout=WAIT_S))
        assert self.last_generation >= self.highest_generation, (
            f"the pool's generation went back from {self.highest_generation} to {self.last_generation}"
        )
        self.highest_generation = self.last_generation

    @invariant()
    def the_kubelet_hears_each_devices_health(self) -> None:
        async def agrees() -> None:
            wanted = {d: "HEALTHY" if self.healthy[d] else "UNHEALTHY" for d in self.listed}
            last: dict[str, str] = {}
            try:
                async with asyncio.timeout(WAIT_S):
                    while (last := dict(self.heard)) != wanted:
                        await asyncio.sleep(0.05)
            except TimeoutError:
                raise AssertionError(f"NodeWatchResources reports {last}, the driver says {wanted}") from None

        self.run(agrees())

    def specs(self) -> set[str]:
        return {p.name for p in (self.folder / "cdi").glob(f"devshim-{GPU}-*.json")}

    @invariant()
    def the_runtime_finds_a_spec_per_prepared_claim(self) -> None:
        wanted = {spec_of(self.shim, GPU, self.claims[d]["metadata"]["uid"]).name for d in self.prepared}
        self.run(
            until(
                lambda: self.specs() == wanted, f"the CDI specs are those of {sorted(self.prepared)}", WAIT_S
            )
        )


@pytest.fixture(
    scope="module", params=[control_plane.param(r, control_plane.BOTH_ENDS) for r in control_plane.APISERVERS]
)
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    with control_plane.running(request.param) as running:
        yield running


def test_the_api_server_and_runtime_converge_on_the_driver_after_any_events(plane: ControlPlane) -> None:
    ConvergeDra.plane = plane
    run_state_machine_as_test(
        ConvergeDra,
        settings=settings(examples(ci=3), stateful_step_count=STEPS, suppress_health_check=list(HealthCheck)),
    )


# Sequences the search found a violation in, kept as they were shrunk: each failed before its fix.
FOUND: dict[str, list[tuple[str, dict[str, Any]]]] = {
    # The state folder lost between prepare and unprepare: the claim's CDI spec outlived it.
    "spec-after-state-lost": [
        ("a_claim_is_prepared", {"device": "gpu-0"}),
        ("devshim_restarts", {"killed": False, "state_kept": False}),
        ("a_claim_is_unprepared", {"device": "gpu-0"}),
    ],
}


@pytest.mark.parametrize("found", FOUND)
def test_a_sequence_the_search_found_still_converges(plane: ControlPlane, found: str) -> None:
    ConvergeDra.plane = plane
    machine = ConvergeDra()
    try:
        for name, arguments in FOUND[found]:
            getattr(machine, name)(**arguments)
            machine.the_api_server_holds_the_pool()
            machine.the_runtime_finds_a_spec_per_prepared_claim()
            machine.the_kubelet_hears_each_devices_health()
    finally:
        machine.teardown()

"""The invariants the soak checks while faults run, and the recovery it waits for after each.

(a) Allocate: the kubelet keeps admitting pods; every Allocate devshim gets is answered within the
    kubelet's deadline, OK or with a clear gRPC error (a code and a message saying why).
(b) Lists: every ListAndWatch list the kubelet receives names every device the drivers have
    (Unhealthy during a fault is fine; missing is not: the kubelet would remove the device).
(c) Recovery: once faults stop, within RECOVERY_BUDGET_S every resource is registered with a live
    stream listing all its devices Healthy, every driver is up and the PodResources emulation on.
(d) Grants: what reaches the kubelet holds only what each resource's policy declares, whatever
    the hostile driver (hostile_driver.py) granted.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence

import grpc

from shim.compat.fakekubelet import (
    AdmissionRejected,
    ContainerSpec,
    EndpointStopped,
    FakeKubeletError,
    PluginSession,
    ProtocolViolation,
)
from shim.compat.fakekubelet.records import HEALTHY, UNHEALTHY, DeviceState, Grant

from .report import Journal, reason
from .world import ALLOWED_ENVS, KUBELET_DEADLINE_S, SERVED, World

RECOVERY_BUDGET_S = 2.0
# How long "healthy" must last to count as recovered: a registration that a late stream end tears
# down a moment later (kubernetes #121994) is not a recovery.
SETTLE_S = 0.2
# Past the kubelet's deadline the call counts as hung even if gRPC's own deadline failed to fire.
HANG_MARGIN_S = 2.0
# gRPC's texts for a handler that raised instead of answering: an error, but not a clear one.
_UNHANDLED = ("Exception calling application", "Unexpected <class", "Unknown error")
NAMESPACE = "soak"
MAX_PODS = 2


def clear(code: grpc.StatusCode, details: str) -> bool:
    """A failure the kubelet can act on: a message, and not gRPC's generic UNKNOWN/INTERNAL for an
    exception devshim let escape."""
    if not details.strip():
        return False
    generic = code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)
    return not (generic and details.startswith(_UNHANDLED))


class ListChecker:
    """Checks every list of every session the kubelet attached (World.sessions, append-only)."""

    def __init__(self, journal: Journal, sessions: Sequence[PluginSession]) -> None:
        self._journal = journal
        self._sessions = sessions
        self._expected: Mapping[str, frozenset[str]] = {s.name: s.devices for s in SERVED}
        self._checked: list[int] = []  # per session (by position): lists checked so far

    def sweep(self) -> None:
        self._checked += [0] * (len(self._sessions) - len(self._checked))
        for i, session in enumerate(self._sessions):
            lists = session.lists
            for devices in lists[self._checked[i] :]:
                self._check(session.resource, devices)
            self._checked[i] = len(lists)

    def _check(self, resource: str, devices: tuple[DeviceState, ...]) -> None:
        self._journal.lists += 1
        ids = [d.id for d in devices]
        want = self._expected.get(resource)
        if want is None:
            self._journal.violate("unknown_resource", f"a list for {resource!r}: {ids}")
            return
        if missing := want - set(ids):
            self._journal.violate("device_missing", f"{resource}: a list without {sorted(missing)}: {ids}")
        if extra := set(ids) - want:
            self._journal.violate("device_unknown", f"{resource}: a list with {sorted(extra)}: {ids}")
        if len(set(ids)) != len(ids):
            self._journal.violate("device_repeated", f"{resource}: {ids}")
        if odd := {d.health for d in devices} - {HEALTHY, UNHEALTHY}:
            self._journal.violate("health_string", f"{resource}: health {sorted(odd)}")

    async def run(self, period_s: float = 0.05) -> None:
        while True:
            self.sweep()
            await asyncio.sleep(period_s)


class GrantChecker:
    """(d) Grants: every grant an Allocate answered holds only the env names its resource's policy
    declares (ALLOWED_ENVS), and no device node or mount, whatever the hostile driver granted."""

    def __init__(self, journal: Journal, grants: Sequence[tuple[str, Grant]]) -> None:
        self._journal = journal
        self._grants = grants  # RecordingKubelet.grants: append-only
        self._checked = 0

    def sweep(self) -> None:
        for resource, grant in self._grants[self._checked :]:
            self._journal.grants += 1
            undeclared = set(grant.envs) - ALLOWED_ENVS.get(resource, set())
            if undeclared or grant.device_nodes or grant.mounts:
                held = f"envs {sorted(grant.envs)}, nodes {grant.device_nodes}, mounts {grant.mounts}"
                self._journal.violate("grant_outside_policy", f"{resource}: {held}")
        self._checked = len(self._grants)

    async def run(self, period_s: float = 0.05) -> None:
        while True:
            self.sweep()
            await asyncio.sleep(period_s)


class Allocator:
    """The kubelet admitting one-device pods, one after another, at random over the resources, and
    ending them again (at most MAX_PODS run at once); each admission is one Allocate (the soak's
    drivers offer neither preferred allocation nor pre-start). Ending a pod on a v1beta2 kubelet
    calls Deallocate."""

    def __init__(self, world: World, journal: Journal, rng: random.Random) -> None:
        self._world = world
        self._journal = journal
        self._rng = rng
        self._pods: deque[tuple[str, str]] = deque()
        self._next = 0

    async def run(self) -> None:
        resources = [s.name for s in SERVED]
        while True:
            outcome = await self.once(self._rng.choice(resources))
            # A refused pod is retried later, as the kubelet would, not in a tight loop.
            await asyncio.sleep(self._rng.uniform(0.0, 0.03) + (0.05 if outcome.startswith("refused") else 0))

    async def once(self, resource: str) -> str:
        """Admit one pod using `resource`; what happened ("OK", the failure, or the refusal)."""
        while len(self._pods) >= MAX_PODS:
            await self._end(*self._pods.popleft())
        name = f"p{self._next}"
        self._next += 1
        spec = [ContainerSpec("c", resource, 1)]
        outcome = await self._timed("Allocate", self._world.kubelet.run_pod(NAMESPACE, name, spec), True)
        if outcome == "OK":
            self._pods.append((name, resource))
        return outcome

    async def _end(self, name: str, resource: str) -> None:
        session = self._world.session(resource)
        # pods.py calls Deallocate only on a live v1beta2 session whose options ask for it.
        calls = session is not None and session.wants_deallocate and not session.stream_ended.is_set()
        await self._timed("Deallocate", self._world.kubelet.end_pod(NAMESPACE, name), calls)

    async def _timed(self, method: str, call: Awaitable[object], counts: bool) -> str:
        calls = self._journal.calls_of(method)
        started = time.monotonic()
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns the call's result when a
            # cancellation arrives as the call completes, and the cancellation is lost (the soak's
            # Allocator then ran on after run_soak cancelled it, and gather waited forever).
            async with asyncio.timeout(KUBELET_DEADLINE_S + HANG_MARGIN_S):
                await call
        except (AdmissionRejected, EndpointStopped) as err:
            # The kubelet's own refusal (no registered plugin, no Healthy device): no call made.
            calls.refused[reason(str(err))] += 1
            return f"refused: {err}"
        except grpc.aio.AioRpcError as err:
            return self._failed(method, err, time.monotonic() - started)
        except ProtocolViolation as err:
            self._journal.violate("protocol", f"{method}: {err}")
            return f"violation: {err}"
        except TimeoutError:
            self._journal.violate("hung_call", f"{method}: no answer within {KUBELET_DEADLINE_S:g} s")
            return "hung"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # The fake kubelet closed its channel under the call (it was restarting): the call was
            # interrupted by the kubelet, not answered or left hanging by devshim.
            calls.failed["interrupted: the kubelet closed its connection (restart)"] += 1
            return "interrupted"
        except FakeKubeletError as err:
            calls.refused[reason(str(err))] += 1
            return f"refused: {err}"
        elapsed = time.monotonic() - started
        if counts:
            calls.ok += 1
            calls.seconds.append(elapsed)
        return "OK"

    def _failed(self, method: str, err: grpc.aio.AioRpcError, elapsed: float) -> str:
        code, details = err.code(), err.details() or ""
        self._journal.calls_of(method).seconds.append(elapsed)
        text = f"{code.name}: {details}"
        self._journal.calls_of(method).failed[reason(text)] += 1
        if code is grpc.StatusCode.DEADLINE_EXCEEDED and elapsed >= KUBELET_DEADLINE_S * 0.95:
            deadline = f"the kubelet's {KUBELET_DEADLINE_S:g} s deadline fired"
            self._journal.violate("hung_call", f"{method}: {deadline}")
        elif not clear(code, details):
            self._journal.violate("unclear_error", f"{method}: {text!r}")
        return text


async def unhealthy(world: World, since: float | None = None) -> str | None:
    """What is not yet as it should be once faults stop; None when everything is. With `since`:
    devshim must also have read PodResources since then."""
    for served in SERVED:
        session = world.session(served.name)
        if session is None:
            return f"{served.name}: not registered with the kubelet"
        if session.stream_ended.is_set():
            return f"{served.name}: ListAndWatch ended ({session.stream_error})"
        if not session.lists:
            return f"{served.name}: no list yet"
        latest = session.latest
        if {d.id for d in latest} != served.devices or not all(d.healthy for d in latest):
            return f"{served.name}: the kubelet's list is {[(d.id, d.health) for d in latest]}"
    status = await world.devshim.status()
    if status is None:
        return "devshim does not answer /status"
    for name, resource in status["resources"].items():
        if not resource["registered"]:
            return f"devshim: {name} is not registered ({resource['last_error']})"
    for name, driver in status["drivers"].items():
        if driver["status"] != "up":
            return f"driver {name}: {driver['status']}"
    if status["deallocation"] != "on":
        return f"deallocation emulation: {status['deallocation']}"
    if since is not None and world.pod_resources.last_answered < since:
        return "devshim has not read PodResources since the fault"
    return None


async def wait_recovered(world: World, since: float, timeout_s: float) -> tuple[float | None, str]:
    """Seconds from `since` until everything was healthy (and stayed so for SETTLE_S), or None if
    that did not happen within `timeout_s`; and the last thing found wrong meanwhile."""
    healthy_since: float | None = None
    last = "nothing"
    while True:
        checked_at = time.monotonic()
        wrong = await unhealthy(world, since)
        if wrong is None:
            healthy_since = healthy_since or checked_at
            if time.monotonic() - healthy_since >= SETTLE_S:
                return healthy_since - since, last
        else:
            healthy_since, last = None, wrong
        if time.monotonic() - since > timeout_s:
            return None, last
        await asyncio.sleep(0.02)

"""Whatever the scheduler and the API server do to the claims, devshim answers each allocation of
its pool's devices with binding conditions, once, and never writes what the server would refuse
(docs/architecture.md, "Shared facts": a claim's binding conditions): a stateful search.

Hypothesis drives what a node's claims meet, in random orders, interleaved with the binder's own
work at random points (``runs_a_while``): the scheduler allocates a claim a device of this node's
pool or another's (with the device's binding copied, or a device without one), frees it (a
binding failure elsewhere, a timeout), or the claim is deleted; the watch ends (its timeout, 410
Gone, an error); the driver starts or stops failing its attach; devshim restarts (a new binder,
remembering nothing). What must hold:

- an attach is never asked for an allocation whose answer the API server holds already (so a
  driver attaches each allocation once, across restarts);
- after ``settles``, every allocation of this node's pool with binding conditions has its answer
  in status.devices (the driver's conditions, or the failure condition when it failed), and no
  claim of another pool, or without binding conditions, was touched;
- the API server never refused a write (422: a device no longer allocated);
- every device the driver attached for an allocation now gone is detached (after the next list
  while the driver fails), also when the allocation went while devshim was down.

The API server is tests/support/memory_claims.py's, with resourceVersions, conflicts and watch
events as the real one has them.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from shim.core.api import ClaimResource
from shim.dra import binding as binding_module
from shim.dra.attached import AttachedStore
from shim.dra.binding import ClaimBinder
from shim.dra.kube import ApiError
from shim.dra.ownership import decide
from shim.errors import SourceFailed
from shim.model import BindingCondition, Device, DeviceBinding
from tests.fuzz.profiles import examples
from tests.support.loop_machine import LoopMachine
from tests.support.memory_claims import MemoryClaims
from tests.support.waiting import until

DRIVER, NODE, OTHER = "gpu.example.com", "node-a", "node-b"
RESOURCE = "example.com/gpu"
ATTACHED, FAILED = "gpu.example.com/attached", "gpu.example.com/attach-failed"
BINDING = DeviceBinding((ATTACHED,), (FAILED,))
COPIED = {"bindingConditions": [ATTACHED], "bindingFailureConditions": [FAILED]}
DEVICES = (Device("gpu-0", binding=BINDING), Device("gpu-1", binding=BINDING), Device("gpu-2"))
CLAIMS = ("c0", "c1", "c2", "c3")
WAIT_S = 10.0


class Attaching:
    """The one call the binder makes of a served resource, answered as a driver would: after a
    few turns of the loop, the conditions True, or a failure while ``failing``."""

    name = RESOURCE

    def __init__(self, api: MemoryClaims) -> None:
        self.api = api
        self.failing = False
        self.violations: list[str] = []
        self.attached: set[tuple[str, str]] = set()  # (claim uid, device) the driver attached

    async def attach(self, device_id: str, claim: str, claim_uid: str) -> tuple[BindingCondition, ...]:
        stored = self.api.claims.get(claim.split("/")[1])
        if stored is not None and _answered(stored, device_id):
            self.violations.append(f"{claim} {device_id}: asked again, answered already")
        for _ in range(3):
            await asyncio.sleep(0)
        if self.failing:
            raise SourceFailed("the fabric is down")
        self.attached.add((claim_uid, device_id))
        return (BindingCondition(ATTACHED, True, "Attached"),)

    async def detach(self, device_id: str, claim: str, claim_uid: str) -> None:
        await asyncio.sleep(0)
        if self.failing:
            raise SourceFailed("the fabric is down")
        self.attached.discard((claim_uid, device_id))


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list(claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", []))


def _answered(claim: dict[str, Any], device: str) -> bool:
    for entry in claim.get("status", {}).get("devices") or ():
        if entry["device"] == device and {c["type"] for c in entry.get("conditions") or ()} & {
            ATTACHED,
            FAILED,
        }:
            return True
    return False


class ClaimsAgainstTheBinder(LoopMachine):
    def __init__(self) -> None:
        super().__init__()
        self.api = MemoryClaims(DRIVER)
        self.resource = Attaching(self.api)
        self.state = Path(tempfile.mkdtemp(prefix="ds-bind-"))  # the attached allocations, kept
        self.ownership = decide([(RESOURCE, DEVICES)])
        self.services = {RESOURCE: cast(ClaimResource, self.resource)}
        self.start(self.binder().run())

    def binder(self) -> ClaimBinder:
        """A binder that remembers nothing, as a restarted devshim's."""
        store = AttachedStore(self.state, DRIVER)
        return ClaimBinder(
            DRIVER, NODE, lambda: self.ownership, lambda: self.services, connect=self.connect, store=store
        )

    async def connect(self, kubeconfig: object) -> MemoryClaims:
        return self.api

    # --- events ----------------------------------------------------------------------------

    @rule(claim=st.sampled_from(CLAIMS), device=st.sampled_from(DEVICES), mine=st.booleans())
    def the_scheduler_allocates(self, claim: str, device: Device, mine: bool) -> None:
        self.api.allocate(claim, NODE if mine else OTHER, device.id, COPIED if device.binding else None)

    @rule(claim=st.sampled_from(CLAIMS))
    def the_scheduler_frees(self, claim: str) -> None:
        self.api.deallocate(claim)

    @rule(claim=st.sampled_from(CLAIMS))
    def the_claim_is_deleted(self, claim: str) -> None:
        self.api.delete(claim)

    @rule(how=st.sampled_from(["timeout", "410", "500"]))
    def the_watch_ends(self, how: str) -> None:
        error = {"timeout": None, "410": ApiError("too old resource version", 410)}.get(how)
        self.api.end_watches(ApiError("etcdserver: leader changed", 500) if how == "500" else error)

    @rule()
    def the_driver_starts_or_stops_failing(self) -> None:
        self.resource.failing = not self.resource.failing

    @rule()
    def devshim_restarts(self) -> None:
        self.stop()
        self.start(self.binder().run())

    # --- what must hold --------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            shutil.rmtree(self.state, ignore_errors=True)

    def live(self) -> set[tuple[str, str]]:
        """(claim uid, device) of every allocation of the pool with binding conditions now."""
        return {
            (claim["metadata"]["uid"], result["device"])
            for claim in self.api.claims.values()
            for result in _results(claim)
            if result["pool"] == NODE and result.get("bindingConditions")
        }

    def detached_all_gone(self) -> bool:
        return self.resource.attached <= self.live()

    def answered_all(self) -> bool:
        for claim in self.api.claims.values():
            for result in _results(claim):
                mine = result["pool"] == NODE and result.get("bindingConditions")
                if mine and not _answered(claim, result["device"]):
                    return False
        return True

    @rule()
    def settles(self) -> None:
        assert not self.resource.violations, self.resource.violations
        self.run(
            until(self.answered_all, "every allocation of the pool with binding conditions answered", WAIT_S)
        )
        if not self.resource.failing:  # a failing driver's detach is asked again at the next list
            self.api.end_watches()
            self.run(until(self.detached_all_gone, "every allocation gone detached", WAIT_S))
        for claim in self.api.claims.values():
            for entry in claim.get("status", {}).get("devices") or ():
                result = next(r for r in _results(claim) if r["device"] == entry["device"])
                assert result["pool"] == NODE and result.get("bindingConditions"), (claim, entry)
        assert self.api.refused == []
        assert not self.resource.violations, self.resource.violations


def test_every_allocation_is_answered_once_whatever_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    # In memory nothing is slow: a watch ending at once is not the API server failing, and a
    # failed round is retried at once.
    monkeypatch.setattr(binding_module, "SHORTEST_WATCH_S", 0.0)
    monkeypatch.setattr(binding_module, "BACKOFF_S", (0.001, 0.01))
    run_state_machine_as_test(
        ClaimsAgainstTheBinder,
        settings=settings(examples(ci=40), stateful_step_count=30, suppress_health_check=list(HealthCheck)),
    )

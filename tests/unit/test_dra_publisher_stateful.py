"""Whatever the API server and others do to a node's slices, the pool published agrees again with
devshim's devices (issue 42): a stateful search over event orders.

Hypothesis drives the events a ResourceSlice pool meets, in random orders and interleaved with
the publisher's own work at random points (``runs_a_while`` gives it a number of event-loop
turns, so an event can land while a write is in flight): the devices change; someone deletes
every slice (a kubelet restart, a plugin deregistration) or one; the watch ends at its timeout,
with 410 Gone, or with an error; a create's reply comes in after the watch delivered that
slice's deletion. After ``settles``, and at the end, the invariant of docs/architecture.md
("Shared facts", ResourceSlices per pool) must hold: the slices in the API server are exactly
the pool devshim would publish (every device once, one generation, the slice count right), and
the generation never went back. The API server is the one in memory of tests/support/memory_api.py,
which keeps resourceVersions and delivers watch events as the real one does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from shim.dra import publisher as publisher_module
from shim.dra.kube import ApiError
from shim.dra.ownership import Offer
from shim.dra.publisher import PoolPublisher
from shim.dra.slices import MAX_DEVICES_PER_SLICE, Pool, PoolDevice, spec
from shim.model import Device
from tests.fuzz.profiles import examples
from tests.support.loop_machine import LoopMachine
from tests.support.memory_api import MemoryApi
from tests.support.waiting import until

DRIVER, NODE = "gpu.example.com", "node-a"
WAIT_S = 10.0  # in memory, agreeing again takes milliseconds; the bound is for a busy machine


def _devices(first: int, count: int) -> list[PoolDevice]:
    return [
        PoolDevice(f"gpu-{n}", Device(f"gpu-{n}", numa_nodes=(n % 2,))) for n in range(first, first + count)
    ]


class PoolAgainstTheApiServer(LoopMachine):
    def __init__(self) -> None:
        super().__init__()
        self.api = MemoryApi()
        self.offer = Offer(_devices(0, 3))
        self.highest = 0  # the highest generation seen published

        async def connect(kubeconfig: Path | None) -> MemoryApi:
            return self.api

        self.publisher = PoolPublisher(DRIVER, NODE, lambda: self.offer, connect=connect)
        self.start(self.publisher.run())
        self.settles()

    # --- events ----------------------------------------------------------------------------

    @rule(first=st.integers(0, 20), count=st.sampled_from([0, 1, 2, 5, MAX_DEVICES_PER_SLICE, 300]))
    def the_devices_change(self, first: int, count: int) -> None:
        self.offer = Offer(_devices(first, count))
        self.publisher.changed()

    @rule()
    def someone_deletes_every_slice(self) -> None:
        self.api.delete_all()

    @rule(which=st.integers(0, 3))
    def someone_deletes_a_slice(self, which: int) -> None:
        names = sorted(self.api.slices)
        if names:
            self.run(self.api.delete_slice("v1", names[which % len(names)], ""))

    @rule(how=st.sampled_from(["timeout", "410", "500"]))
    def the_watch_ends(self, how: str) -> None:
        error = {"timeout": None, "410": ApiError("too old resource version", 410)}.get(how)
        self.api.end_watches(ApiError("etcdserver: leader changed", 500) if how == "500" else error)

    @rule()
    def a_create_is_answered_after_its_deletion(self) -> None:
        async def deleted_first(created: dict[str, Any]) -> None:
            self.api.before_reply = None
            gone = self.api.delete_all()
            # The reply waits for the watch to deliver the deletion, while a watch is open (one
            # ended meanwhile delivers nothing, and the reply just comes late).
            while self.api.delivered < gone and self.api.watching:
                await asyncio.sleep(0)

        self.api.before_reply = deleted_first

    # --- what must hold --------------------------------------------------------------------

    def published(self) -> list[dict[str, Any]]:
        return sorted(
            (s["spec"] for s in self.api.slices.values()), key=lambda s: [d["name"] for d in s["devices"]]
        )

    def wanted(self, generation: int) -> list[dict[str, Any]]:
        pool = Pool.named(DRIVER, NODE, self.offer.devices)
        chunks = pool.chunks()
        specs = [spec(pool, chunk, generation, len(chunks), "v1") for chunk in chunks]
        return sorted(specs, key=lambda s: [d["name"] for d in s["devices"]])

    def agrees(self) -> bool:
        generations = {s["pool"]["generation"] for s in self.published()}
        return len(generations) == 1 and self.published() == self.wanted(generations.pop())

    @rule()
    def settles(self) -> None:
        self.api.before_reply = None  # a race not met by now is not one any more
        self.run(until(self.agrees, "the pool published is the one wanted", WAIT_S))
        generation = self.published()[0]["pool"]["generation"]
        assert generation >= self.highest, f"the generation went back from {self.highest} to {generation}"
        self.highest = generation


def test_the_published_pool_agrees_again_after_any_events(monkeypatch: pytest.MonkeyPatch) -> None:
    # In memory nothing is slow: a watch ending at once is not the API server failing, a failed
    # round is retried at once, and changes are not held back to be written together.
    monkeypatch.setattr(publisher_module, "SHORTEST_WATCH_S", 0.0)
    monkeypatch.setattr(publisher_module, "BACKOFF_S", (0.001, 0.01))
    monkeypatch.setattr(publisher_module, "COALESCE_S", 0.0)
    run_state_machine_as_test(
        PoolAgainstTheApiServer,
        settings=settings(examples(ci=40), stateful_step_count=25, suppress_health_check=list(HealthCheck)),
    )

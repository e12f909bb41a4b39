"""Counters across both APIs (core/counters.py, core/holds.py), searched: whatever order claims
and containers take and give back a GPU and its partitions in, the devices held through either
API never consume more than the GPU's counter set, and what each API is shown it may have.

A GPU brings the set {slices: 4}; the whole GPU consumes 4, each half 2, each quarter 1. After
every step:

- the devices held (claims, containers, what PodResources lists) consume at most the set;
- a device the device plugin is shown Healthy, held by none, is one it may have (its request is
  not refused);
- a device DRA publishes, held by none, whose consumption fits the published set less what the
  claims hold (the scheduler's count), is one a claim may have.
"""

from __future__ import annotations

from fractions import Fraction

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from shim.core import counters
from shim.core.holds import Holds
from shim.driverprotocol import quantity_value
from shim.errors import DeviceHeld
from shim.model import CounterSet, Device, Health
from tests.fuzz.profiles import examples

SET = "gpu-0"


def _device(name: str, slices: int, brings: bool = False) -> Device:
    consumed = (CounterSet(SET, (("slices", str(slices)),)),)
    return Device(
        name,
        counter_sets=(CounterSet(SET, (("slices", "4"),)),) if brings else (),
        consumes_counters=consumed,
    )


DEVICES = (
    _device("whole", 4, brings=True),
    _device("half-0", 2),
    _device("half-1", 2),
    *(_device(f"quarter-{n}", 1) for n in range(4)),
)
BY_ID = {d.id: d for d in DEVICES}
IDS = tuple(BY_ID)
CLAIMS = ("claim a/one (1)", "claim a/two (2)", "claim a/three (3)")
some = st.lists(st.sampled_from(IDS), min_size=1, max_size=2, unique=True)


def consumed(device_ids: set[str]) -> Fraction:
    return sum((counters.consumption(BY_ID[i].consumes_counters[0])[0][1] for i in device_ids), Fraction(0))


class CountersSearch(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.holds = Holds("example.com/gpu", lambda: BY_ID)
        self.claims: dict[str, str] = {}  # device -> claim
        self.containers: list[tuple[str, ...]] = []
        self.listed: frozenset[str] = frozenset()

    def plugin_held(self) -> set[str]:
        return {i for group in self.containers for i in group} | self.listed

    @rule(devices=some, claim=st.sampled_from(CLAIMS))
    def a_claim_is_prepared(self, devices: list[str], claim: str) -> None:
        try:
            self.holds.check_for_claim(devices, claim)
        except DeviceHeld:
            return
        self.holds.claim_prepared(devices, claim)
        self.claims.update(dict.fromkeys(devices, claim))

    @rule(devices=some, claim=st.sampled_from(CLAIMS))
    def a_claim_gives_back(self, devices: list[str], claim: str) -> None:
        self.holds.claim_freed(devices, claim)
        for device in devices:
            if self.claims.get(device) == claim:
                del self.claims[device]

    @rule(devices=some)
    def a_container_is_allocated(self, devices: list[str]) -> None:
        try:
            self.holds.check_for_plugin(devices)
        except DeviceHeld:
            return
        self.holds.plugin_allocated(devices)
        self.containers = [g for g in self.containers if not set(g) & set(devices)]
        self.containers.append(tuple(devices))

    @rule(devices=some)
    def the_kubelet_frees_devices(self, devices: list[str]) -> None:
        self.holds.plugin_freed(devices)
        self.containers = [g for g in self.containers if not set(g) & set(devices)]

    @rule(data=st.data())
    def pod_resources_lists(self, data: st.DataObject) -> None:
        """What containers hold, as the kubelet lists it (a subset: some already gone)."""
        held = sorted({i for group in self.containers for i in group})
        self.listed = frozenset(data.draw(st.lists(st.sampled_from(held), unique=True)) if held else ())
        self.holds.plugin_listed(self.listed)

    @invariant()
    def never_overdrawn(self) -> None:
        held = set(self.claims) | self.plugin_held()
        assert consumed(held) <= 4, f"held {sorted(held)} consume more than the set"

    @invariant()
    def what_the_device_plugin_is_shown_it_may_have(self) -> None:
        held = set(self.claims) | self.plugin_held()
        for device in self.holds.for_plugin(DEVICES):
            if device.health is Health.HEALTHY and device.id not in held:
                self.holds.check_for_plugin([device.id])  # raises if refused

    @invariant()
    def what_dra_publishes_a_claim_may_have(self) -> None:
        published = self.holds.for_dra(DEVICES)
        brought = [c for d in published for c in d.counter_sets]
        if not brought:
            return  # the whole GPU is a container's: no set, nothing allocatable
        left = quantity_value(dict(brought[0].counters)["slices"]) - consumed(set(self.claims))
        for device in published:
            if device.id not in self.claims and consumed({device.id}) <= left:
                self.holds.check_for_claim([device.id], "claim a/new (9)")


def test_no_order_of_claims_and_containers_overdraws_a_counter_set() -> None:
    run_state_machine_as_test(CountersSearch, settings=examples(150))

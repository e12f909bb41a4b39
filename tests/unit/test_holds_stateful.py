"""Which API holds a device (core/holds.py), searched: the kubelet's device manager and the
scheduler each act on what devshim shows them, so what each is shown must never offer a device
the other holds, whatever order claims, shares and containers come and go in.

Hypothesis drives a resource's holds through exclusive claims, shares of a device several claims
may share (consumable capacity), containers allocated and freed through the device plugin and
listed by PodResources, and claims given back (by their own holder or by another claim); a model
beside it says what each request must get. After every step:

- a request is refused exactly when the model says another holds the device;
- the device plugin's list shows a device Unhealthy exactly while a claim or a share holds it;
- the published pool leaves out exactly the devices containers hold;
- /status's "dra" names exactly the devices claims and shares hold;
- a claim never frees a device another claim holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from shim.core.holds import Holds
from shim.errors import DeviceHeld
from shim.model import Device, Health
from tests.fuzz.profiles import examples

DEVICES = ("g0", "g1", "g2")
CLAIMS = ("claim a/one (1)", "claim a/two (2)", "claim a/three (3)")
some_devices = st.lists(st.sampled_from(DEVICES), min_size=1, max_size=3, unique=True)


@dataclass
class Model:
    exclusive: dict[str, str] = field(default_factory=dict)  # device -> claim
    shares: dict[str, set[str]] = field(default_factory=dict)  # device -> claims
    containers: list[tuple[str, ...]] = field(default_factory=list)  # allocated groups, oldest first
    listed: frozenset[str] = frozenset()

    def plugin_held(self, device: str) -> bool:
        return any(device in group for group in self.containers) or device in self.listed

    def dra_held(self, device: str) -> bool:
        return device in self.exclusive or bool(self.shares.get(device))

    def claim_may(self, devices: list[str], claim: str, shared: bool) -> bool:
        for device in devices:
            if self.plugin_held(device) or self.exclusive.get(device, claim) != claim:
                return False
            if not shared and self.shares.get(device, set()) - {claim}:
                return False
        return True


class HoldsSearch(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.holds = Holds("example.com/gpu")
        self.model = Model()

    def _claim(self, devices: list[str], claim: str, shared: bool) -> None:
        allowed = self.model.claim_may(devices, claim, shared)
        try:
            self.holds.check_for_claim(devices, claim, shared=shared)
        except DeviceHeld:
            assert not allowed, f"{claim} refused {devices} that the model allows"
            return
        assert allowed, f"{claim} given {devices}, held by another in the model: {self.model}"
        self.holds.claim_prepared(devices, claim, shared=shared)
        for device in devices:
            if shared:
                self.model.shares.setdefault(device, set()).add(claim)
            else:
                self.model.exclusive[device] = claim

    @rule(devices=some_devices, claim=st.sampled_from(CLAIMS))
    def a_claim_is_prepared(self, devices: list[str], claim: str) -> None:
        self._claim(devices, claim, shared=False)

    @rule(device=st.sampled_from(DEVICES), claim=st.sampled_from(CLAIMS))
    def a_share_is_prepared(self, device: str, claim: str) -> None:
        self._claim([device], claim, shared=True)

    @rule(devices=some_devices, claim=st.sampled_from(CLAIMS))
    def a_claim_gives_back(self, devices: list[str], claim: str) -> None:
        others = {d: h for d, h in self.model.exclusive.items() if h != claim}
        self.holds.claim_freed(devices, claim)
        for device in devices:
            if self.model.exclusive.get(device) == claim:
                del self.model.exclusive[device]
            self.model.shares.get(device, set()).discard(claim)
        assert all(self.model.exclusive.get(d) == h for d, h in others.items())

    @rule(devices=some_devices)
    def a_container_is_allocated(self, devices: list[str]) -> None:
        allowed = not any(self.model.dra_held(d) for d in devices)
        try:
            self.holds.check_for_plugin(devices)
        except DeviceHeld:
            assert not allowed, f"the device plugin refused {devices}, free in the model"
            return
        assert allowed, f"the device plugin given {devices}, which a claim holds: {self.model}"
        self.holds.plugin_allocated(devices)
        # The kubelet reassigns devices: an older group sharing one is superseded.
        self.model.containers = [g for g in self.model.containers if not set(g) & set(devices)]
        self.model.containers.append(tuple(devices))

    @rule(devices=some_devices)
    def the_kubelet_frees_devices(self, devices: list[str]) -> None:
        self.holds.plugin_freed(devices)
        self.model.containers = [g for g in self.model.containers if not set(g) & set(devices)]

    @rule(devices=st.lists(st.sampled_from(DEVICES), max_size=3, unique=True))
    def pod_resources_lists(self, devices: list[str]) -> None:
        self.holds.plugin_listed(devices)
        self.model.listed = frozenset(devices)

    @invariant()
    def each_api_is_shown_what_the_other_does_not_hold(self) -> None:
        devices = tuple(Device(d) for d in DEVICES)
        unhealthy = {d.id for d in self.holds.for_plugin(devices) if d.health is Health.UNHEALTHY}
        assert unhealthy == {d for d in DEVICES if self.model.dra_held(d)}
        published = {d.id for d in self.holds.for_dra(devices)}
        assert published == {d for d in DEVICES if not self.model.plugin_held(d)}
        assert self.holds.status()["dra"] == sorted(d for d in DEVICES if self.model.dra_held(d))


def test_no_order_of_claims_shares_and_containers_shows_one_api_the_others_device() -> None:
    run_state_machine_as_test(HoldsSearch, settings=examples(150))

"""Counters across both APIs (core/counters.py, core/holds.py): a GPU that brings a counter set,
the whole GPU and its two halves each consuming from it, served through the device plugin and
DRA at once. Whatever holds a part of the set, through either API, the other API cannot have
what would overdraw it: the device plugin sees such a device Unhealthy and is refused it, DRA
publishes the set less what containers' devices consume and a claim on it is refused."""

from __future__ import annotations

from fractions import Fraction

import pytest

from shim.core import counters
from shim.core.holds import Holds
from shim.errors import DeviceHeld
from shim.model import CounterSet, Device, Health

CLAIM = "claim default/c (uid-1)"
SET = "gpu-0"
WHOLE = Device(
    "gpu-0",
    counter_sets=(CounterSet(SET, (("memory", "80Gi"), ("slices", "2"))),),
    consumes_counters=(CounterSet(SET, (("memory", "80Gi"), ("slices", "2"))),),
)
HALVES = tuple(
    Device(f"gpu-0-half-{n}", consumes_counters=(CounterSet(SET, (("memory", "40Gi"), ("slices", "1"))),))
    for n in (0, 1)
)
PLAIN = Device("gpu-1")
DEVICES = (WHOLE, *HALVES, PLAIN)
BY_ID = {d.id: d for d in DEVICES}


def holds() -> Holds:
    return Holds("example.com/gpu", lambda: BY_ID)


def health(shown: tuple[Device, ...]) -> dict[str, Health]:
    return {d.id: d.health for d in shown}


def test_nothing_held_changes_nothing() -> None:
    held = holds()
    assert held.for_plugin(DEVICES) == DEVICES
    assert held.for_dra(DEVICES) == DEVICES
    held.check_for_plugin(["gpu-0"])
    held.check_for_claim(["gpu-0-half-0", "gpu-0-half-1"], CLAIM)


def test_a_half_a_claim_holds_leaves_the_other_half_and_takes_the_whole_gpu_from_the_device_plugin() -> None:
    held = holds()
    held.claim_prepared(["gpu-0-half-0"], CLAIM)
    assert health(held.for_plugin(DEVICES)) == {
        "gpu-0": Health.UNHEALTHY,  # its counters are half taken
        "gpu-0-half-0": Health.UNHEALTHY,  # the claim's
        "gpu-0-half-1": Health.HEALTHY,
        "gpu-1": Health.HEALTHY,
    }
    with pytest.raises(DeviceHeld, match="counter set gpu-0"):
        held.check_for_plugin(["gpu-0"])
    held.check_for_plugin(["gpu-0-half-1"])
    # The scheduler counts claims itself: DRA's view is whole.
    assert held.for_dra(DEVICES) == DEVICES


def test_a_half_a_container_holds_is_taken_from_the_counters_dra_publishes() -> None:
    held = holds()
    held.plugin_allocated(["gpu-0-half-1"])
    published = held.for_dra(DEVICES)
    assert [d.id for d in published] == ["gpu-0", "gpu-0-half-0", "gpu-1"]
    [gpu] = [d for d in published if d.id == "gpu-0"]
    assert gpu.counter_sets == (CounterSet(SET, (("memory", "40Gi"), ("slices", "1"))),)
    with pytest.raises(DeviceHeld, match=r"DRA claims and containers, which consume counter set gpu-0"):
        held.check_for_claim(["gpu-0"], CLAIM)
    held.check_for_claim(["gpu-0-half-0"], CLAIM)
    assert health(held.for_plugin(DEVICES))["gpu-0"] is Health.UNHEALTHY
    # Freed: the whole set is published again.
    held.plugin_freed(["gpu-0-half-1"])
    assert held.for_dra(DEVICES) == DEVICES


def test_the_whole_gpu_a_container_holds_takes_every_half_from_both_apis() -> None:
    held = holds()
    held.plugin_listed(["gpu-0"])  # as PodResources lists it after a devshim restart
    assert [d.id for d in held.for_dra(DEVICES)] == ["gpu-0-half-0", "gpu-0-half-1", "gpu-1"]
    for half in ("gpu-0-half-0", "gpu-0-half-1"):
        with pytest.raises(DeviceHeld, match="counter set gpu-0"):
            held.check_for_claim([half], CLAIM)
        with pytest.raises(DeviceHeld, match="counter set gpu-0"):
            held.check_for_plugin([half])
    assert health(held.for_plugin(DEVICES))["gpu-0-half-0"] is Health.UNHEALTHY


def test_one_request_for_both_halves_fits_and_for_a_half_and_the_whole_does_not() -> None:
    held = holds()
    held.check_for_plugin(["gpu-0-half-0", "gpu-0-half-1"])
    with pytest.raises(DeviceHeld, match="counter set gpu-0"):
        held.check_for_plugin(["gpu-0-half-0", "gpu-0"])


@pytest.mark.parametrize(
    ("value", "text"),
    [(Fraction(5), "5"), (Fraction(3, 2), "1500m"), (Fraction(1, 3), "333m"), (Fraction(0), "0")],
)
def test_what_is_left_is_written_as_a_quantity_never_overstated(value: Fraction, text: str) -> None:
    assert counters.quantity_text(value) == text

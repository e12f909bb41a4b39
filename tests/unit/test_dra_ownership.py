"""Which resource of a DRA pool owns each device name (shim/dra/ownership.py): the one rule the
publisher, the preparer and the health stream share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shim.dra.health import DeviceHealth, PoolHealth
from shim.dra.names import device_name
from shim.dra.ownership import CLASHES_SAID, PoolOwners, Served, decide
from shim.model import Attribute, AttributeKind, Device, Health

HONEST, HOSTILE = "example.com/gpu", "evil.example.com/gpu"
GPU0 = Device("gpu-0", attributes=(("model", Attribute(AttributeKind.STRING, "honest")),))
FORGED = Device("gpu-0", attributes=(("model", Attribute(AttributeKind.STRING, "forged")),))


def test_the_resource_listed_first_keeps_a_device_id_both_list() -> None:
    """The hostile resource, listed second, loses only the colliding device; the clash names
    both resources and the device."""
    ownership = decide([(HONEST, [GPU0, Device("gpu-1")]), (HOSTILE, [FORGED, Device("evil-9")])])
    assert ownership.names == {
        "gpu-0": (HONEST, "gpu-0"),
        "gpu-1": (HONEST, "gpu-1"),
        "evil-9": (HOSTILE, "evil-9"),
    }
    assert ownership.ids == {HONEST: {"gpu-0": "gpu-0", "gpu-1": "gpu-1"}, HOSTILE: {"evil-9": "evil-9"}}
    problem = ownership.problem()
    assert problem is not None
    assert f"device 'gpu-0' of {HOSTILE} is refused" in problem
    assert f"is {HONEST}'s device 'gpu-0'" in problem


def test_the_published_devices_are_the_owners_own_with_their_attributes() -> None:
    ownership = decide([(HONEST, [GPU0]), (HOSTILE, [FORGED, Device("evil-9")])])
    published = ownership.published({HOSTILE: [FORGED, Device("evil-9")], HONEST: [GPU0]})
    assert sorted((e.name, e.device) for e in published) == [
        ("evil-9", Device("evil-9")),
        ("gpu-0", GPU0),
    ]


def test_the_configured_order_decides_not_which_driver_listed_first() -> None:
    """The same lists give the same owners whatever order each driver lists its devices in (as
    after a restart, drivers starting in any order); only the configuration's order moves a name."""
    first = decide([(HONEST, [GPU0, Device("a")]), (HOSTILE, [Device("z"), FORGED])])
    shuffled = decide([(HONEST, [Device("a"), GPU0]), (HOSTILE, [FORGED, Device("z")])])
    assert first == shuffled
    swapped = decide([(HOSTILE, [FORGED]), (HONEST, [GPU0])])
    assert swapped.names["gpu-0"] == (HOSTILE, "gpu-0")


def test_ids_of_one_resource_meeting_in_one_name_leave_it_to_the_one_sorting_first() -> None:
    taken = device_name("GPU_0")  # gpu-0-<hash>: itself a DNS label, so another ID may be it
    for order in ([Device("GPU_0"), Device(taken)], [Device(taken), Device("GPU_0")]):
        ownership = decide([(HONEST, order)])
        assert ownership.names == {taken: (HONEST, "GPU_0")}
        assert f"device {taken!r} of {HONEST} is refused" in (ownership.problem() or "")


def test_a_pool_without_clashes_has_no_problem() -> None:
    ownership = decide([(HONEST, [GPU0]), (HOSTILE, [Device("evil-0")])])
    assert ownership.problem() is None and ownership.clashes == ()


def test_a_flood_of_clashes_is_said_in_a_bounded_message() -> None:
    devices = [Device(f"d{i}") for i in range(10_000)]
    ownership = decide([(HONEST, devices), (HOSTILE, devices)])
    assert len(ownership.clashes) == 10_000
    problem = ownership.problem() or ""
    assert problem.count("is refused") == CLASHES_SAID
    assert f"and {10_000 - CLASHES_SAID} more" in problem and len(problem) < 1000


@given(
    st.lists(
        st.lists(
            st.sampled_from(["a", "A", device_name("A"), "b", "GPU_0", device_name("GPU_0")]), max_size=6
        ),
        min_size=1,
        max_size=4,
    )
)
def test_every_name_has_one_owner_and_every_device_is_owned_or_refused(lists: list[list[str]]) -> None:
    listed = [(f"r{i}", [Device(d) for d in ids]) for i, ids in enumerate(lists)]
    ownership = decide(listed)
    for resource, devices in listed:
        for device in devices:
            owner = ownership.names[device_name(device.id)]
            assert owner == (resource, device.id) or any(
                (c.resource, c.device_id, c.owner) == (resource, device.id, owner) for c in ownership.clashes
            )
            # The owner is the earliest resource listing the name, then the smallest ID there.
            claimants = [
                (i, d.id)
                for i, (_, ds) in enumerate(listed)
                for d in ds
                if device_name(d.id) == device_name(device.id)
            ]
            position, device_id = min(claimants)
            assert owner == (listed[position][0], device_id)


class Listing:
    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices = tuple(devices)


def test_pool_owners_decide_again_only_when_a_list_changes() -> None:
    served: dict[str, Listing] = {HOSTILE: Listing([FORGED])}

    def services() -> Mapping[str, Served]:
        return served

    owners = PoolOwners([HONEST, HOSTILE], services)
    before = owners()
    # The honest driver is not up yet, and there is no inventory (a first start): nothing is held.
    assert before.names["gpu-0"] == (HOSTILE, "gpu-0")
    assert owners() is before
    served[HONEST] = Listing([GPU0])
    assert owners().names["gpu-0"] == (HONEST, "gpu-0")


def test_health_is_reported_for_each_name_by_its_owner_alone() -> None:
    """The hostile resource cannot make the honest gpu-0 look Unhealthy to the kubelet."""
    served: dict[str, Any] = {
        HONEST: Listing([GPU0]),
        HOSTILE: Listing([replace(FORGED, health=Health.UNHEALTHY), Device("evil-0")]),
    }
    owners = PoolOwners([HONEST, HOSTILE], lambda: served)
    assert PoolHealth(owners, lambda: served).report() == [
        DeviceHealth("gpu-0", healthy=True),
        DeviceHealth("evil-0", healthy=True),
    ]

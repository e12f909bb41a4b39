"""A DRA pool's resource keeps its device names while it is not served (shim/dra/ownership.py):
its last-known devices (its last list, or its driver's inventory) hold them, so a later resource
listing the same IDs in that gap is refused, and no one publishes, prepares or reports them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shim.dra.health import DeviceHealth, PoolHealth
from shim.dra.names import device_name
from shim.dra.node import _inventories
from shim.dra.ownership import PoolOwners, decide
from shim.inventory import InventoryStore, SavedResource
from shim.model import Attribute, AttributeKind, Device
from shim.settings import Settings

HONEST, HOSTILE = "example.com/gpu", "evil.example.com/gpu"
GPU0 = Device("gpu-0", attributes=(("model", Attribute(AttributeKind.STRING, "honest")),))
FORGED = Device("gpu-0", attributes=(("model", Attribute(AttributeKind.STRING, "forged")),))
EVIL9 = Device("evil-9")


class Listing:
    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices = tuple(devices)


class Pool:
    """The pool's served resources as a test sets them, read as DraDrivers reads them."""

    def __init__(self, known: Mapping[str, Sequence[Device]] | None = None) -> None:
        self.served: dict[str, Any] = {}  # Listings, standing in for ResourceServices
        self.known = dict(known or {})
        self.asked: list[str] = []
        self.owners = PoolOwners([HONEST, HOSTILE], self.services, self.last_known)

    def services(self) -> Mapping[str, Any]:
        return self.served

    def last_known(self, resource: str) -> Sequence[Device]:
        self.asked.append(resource)
        return self.known.get(resource, ())

    def published(self) -> list[tuple[str, Device]]:
        lists = {r: s.devices for r, s in self.served.items()}
        return sorted((e.name, e.device) for e in self.owners().published(lists))


def test_an_owner_whose_driver_is_away_keeps_its_names_until_it_lists_without_them() -> None:
    """The honest resource leaves the served ones (its driver gone by a reload): the hostile
    gpu-0 stays refused, gpu-0 is neither published nor reported, and a claim for it names the
    honest resource (which is not served, so it is not prepared); only the honest resource's own
    list without gpu-0 lets the hostile one have it."""
    pool = Pool()
    pool.served = {HONEST: Listing([GPU0]), HOSTILE: Listing([FORGED, EVIL9])}
    assert pool.published() == [("evil-9", EVIL9), ("gpu-0", GPU0)]
    del pool.served[HONEST]

    ownership = pool.owners()
    assert ownership.names["gpu-0"] == (HONEST, "gpu-0")
    assert pool.published() == [("evil-9", EVIL9)]
    assert PoolHealth(pool.owners, pool.services).report() == [DeviceHealth("evil-9", healthy=True)]
    problem = ownership.problem() or ""
    assert f"device 'gpu-0' of {HOSTILE} is refused" in problem
    assert f"is {HONEST}'s device 'gpu-0' (held while {HONEST} is not served)" in problem

    pool.served[HONEST] = Listing([Device("gpu-1")])
    assert pool.owners().names["gpu-0"] == (HOSTILE, "gpu-0")
    assert pool.published() == [("evil-9", EVIL9), ("gpu-0", FORGED), ("gpu-1", Device("gpu-1"))]
    assert pool.owners().problem() is None
    assert pool.asked == [], "a resource seen served is held by its last list, not its inventory"


def test_an_owner_not_served_since_start_holds_its_inventory() -> None:
    """devshim started; the hostile driver lists first, the honest resource is not served yet:
    its inventory holds gpu-0, read once; the honest list, once served, replaces it."""
    pool = Pool(known={HONEST: [GPU0, Device("gpu-1")]})
    pool.served = {HOSTILE: Listing([FORGED, EVIL9])}
    assert pool.owners().names["gpu-0"] == (HONEST, "gpu-0")
    assert pool.published() == [("evil-9", EVIL9)]
    assert pool.asked == [HONEST], "read once, and only for the resource not served"

    pool.served[HONEST] = Listing([Device("gpu-1")])
    assert pool.published() == [("evil-9", EVIL9), ("gpu-0", FORGED), ("gpu-1", Device("gpu-1"))]
    assert pool.asked == [HONEST]


IDS = ["a", "A", device_name("A"), "b", "GPU_0", device_name("GPU_0")]


@given(
    st.lists(
        st.tuples(st.lists(st.sampled_from(IDS), max_size=6, unique=True), st.booleans()),
        min_size=1,
        max_size=4,
    )
)
def test_the_owners_are_those_of_every_last_known_list_and_only_served_ones_are_published(
    pool: list[tuple[list[str], bool]],
) -> None:
    """Whichever resources are served, the owners are decide()'s over every resource's
    last-known list, and no name a resource not served holds is published or reported."""
    resources = [f"r{i}.example.com/dev" for i in range(len(pool))]
    lists = {r: [Device(i) for i in ids] for r, (ids, _) in zip(resources, pool, strict=True)}
    served: dict[str, Any] = {r: Listing(lists[r]) for r, (_, up) in zip(resources, pool, strict=True) if up}
    owners = PoolOwners(resources, lambda: served, lambda r: lists[r])
    ownership = owners()
    assert ownership.names == decide([(r, lists[r]) for r in resources]).names
    published = ownership.published({r: s.devices for r, s in served.items()})
    assert len({e.name for e in published}) == len(published)
    for entry in published:
        resource, device_id = ownership.names[entry.name]
        assert resource in served and device_id == entry.device.id
    reported = {h.device for h in PoolHealth(owners, lambda: served).report()}
    assert reported == {e.name for e in published}


def test_the_inventory_read_is_the_configured_drivers(tmp_path: Path) -> None:
    """What a driver host saved for a pool's resource, under the state dir of the driver the
    settings give it: another driver's file for that name is not read."""
    settings = Settings.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "drivers": [
                {"name": "honest", "command": ["true"], "resources": [HONEST]},
                {"name": "hostile", "command": ["true"], "resources": [HOSTILE]},
            ],
            "dra": {
                "node_name": "node-1",
                "drivers": [{"name": "gpu.example.com", "resources": [HONEST, HOSTILE]}],
            },
        }
    )
    drivers = tmp_path / "state" / "drivers"
    InventoryStore(drivers / "honest").save(HONEST, SavedResource((GPU0,), ()))
    InventoryStore(drivers / "hostile").save(HONEST, SavedResource((Device("gpu-7"),), ()))
    last_known = _inventories(settings)
    assert last_known(HONEST) == (GPU0,)
    assert last_known(HOSTILE) == ()
    assert last_known("example.com/unconfigured") == ()

"""DeviceGroups: one group per allocation, a device in one group at most."""

from __future__ import annotations

import pytest

from shim.groups import DeviceGroups


def test_a_new_group_supersedes_every_group_sharing_a_device() -> None:
    groups: DeviceGroups[float] = DeviceGroups([("a", "b"), ("c",), ("d", "e")])
    groups.add(("b", "d"))
    assert list(groups) == [("c",), ("b", "d")]
    # a and e were freed with their groups: allocating them again supersedes nothing else.
    groups.add(("a",))
    groups.add(("e",))
    assert list(groups) == [("c",), ("b", "d"), ("a",), ("e",)]


def test_the_same_group_again_is_renewed_and_moved_last_with_a_fresh_value() -> None:
    groups: DeviceGroups[float] = DeviceGroups()
    assert groups.add(("a", "b"), 5.0)
    assert groups.add(("c",))
    assert not groups.add(("a", "b"))  # nothing to save again
    assert groups.add(("a",))  # supersedes (a, b)
    assert groups.add(("a", "b"))
    assert groups.items() == [(("c",), None), (("a", "b"), None)]


def test_drop_sharing_and_drop_free_the_devices_of_the_groups_they_remove() -> None:
    groups: DeviceGroups[float] = DeviceGroups([("a", "b"), ("c",), ("d",)])
    groups.drop_sharing(["b", "x"])
    groups.drop(("c",))
    assert list(groups) == [("d",)]
    groups.add(("a", "c"))  # nothing of the dropped groups is still indexed
    assert list(groups) == [("d",), ("a", "c")]
    with pytest.raises(KeyError):
        groups.drop(("c",))


def test_values_change_only_for_held_groups_and_empty_groups_are_not_kept() -> None:
    groups: DeviceGroups[float] = DeviceGroups([("a",)])
    groups[("a",)] = 3.0
    assert groups[("a",)] == 3.0
    with pytest.raises(KeyError):
        groups[("b",)] = 1.0
    assert not groups.add(())
    assert len(groups) == 1


def test_a_group_naming_a_device_twice_is_dropped_whole() -> None:
    groups: DeviceGroups[float] = DeviceGroups([("a", "a", "b")])
    groups.add(("b",))
    assert list(groups) == [("b",)]
    groups.add(("a",))
    assert list(groups) == [("b",), ("a",)]

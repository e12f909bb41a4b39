"""Deallocate emulation's bookkeeping: when an allocated device group counts as free."""

from __future__ import annotations

from shim.core.release import ReleaseTracker

GPU = "example.com/gpu"


def test_a_group_no_container_holds_is_released_once_after_the_grace_period() -> None:
    """Free at t=0, still free at t=29 (grace 30): kept; at t=30: released, and only once."""
    tracker = ReleaseTracker(grace_s=30)
    tracker.allocated(GPU, ["a", "b"])
    assert tracker.observe({GPU: {"a", "b"}}, now=0) == {}
    assert tracker.observe({}, now=1) == {}
    assert tracker.observe({}, now=30) == {}
    assert tracker.observe({}, now=31) == {GPU: [("a", "b")]}
    assert tracker.observe({}, now=100) == {}


def test_a_device_seen_in_use_again_restarts_the_grace_period() -> None:
    """A group briefly missing from List (an init container finishing) is not released."""
    tracker = ReleaseTracker(grace_s=10)
    tracker.allocated(GPU, ["a"])
    assert tracker.observe({}, now=0) == {}
    assert tracker.observe({GPU: {"a"}}, now=9) == {}
    assert tracker.observe({}, now=12) == {}
    assert tracker.observe({}, now=21) == {}
    assert tracker.observe({}, now=22) == {GPU: [("a",)]}


def test_an_app_container_reusing_init_devices_supersedes_the_init_group() -> None:
    """The init container's group is replaced by the app container's Allocate of the same IDs:
    one deallocate when the pod ends, never one for the init container."""
    tracker = ReleaseTracker(grace_s=5)
    tracker.allocated(GPU, ["a", "b"])  # init container
    assert tracker.observe({}, now=0) == {}
    tracker.allocated(GPU, ["a", "b"])  # app container, same devices, within the grace period
    assert tracker.observe({GPU: {"a", "b"}}, now=4) == {}
    assert tracker.observe({GPU: {"a", "b"}}, now=100) == {}
    assert tracker.held(GPU) == [("a", "b")]
    assert tracker.observe({}, now=101) == {}
    assert tracker.observe({}, now=106) == {GPU: [("a", "b")]}


def test_resources_are_tracked_apart() -> None:
    """The same ID under another resource is another device."""
    tracker = ReleaseTracker(grace_s=0)
    tracker.allocated(GPU, ["a"])
    tracker.allocated("example.com/nic", ["a"])
    assert tracker.observe({"example.com/nic": {"a"}}, now=0) == {}
    assert tracker.observe({"example.com/nic": {"a"}}, now=1) == {GPU: [("a",)]}

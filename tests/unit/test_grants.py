"""Grants compared and kept by value: equal answers of a driver share one object."""

from __future__ import annotations

from shim.grants import Equal
from shim.model import ContainerGrant, DeviceNode, Mount


def grant(env: str = "0", read_only: bool = True) -> ContainerGrant:
    return ContainerGrant(
        envs={"GPU": env},
        mounts=(Mount("/c", "/h", read_only),),
        device_nodes=(DeviceNode("/dev/g0", "/dev/g0"),),
        annotations={"a": "b"},
        cdi_devices=("vendor.com/gpu=0",),
    )


def test_grants_are_equal_and_hash_alike_by_value() -> None:
    assert grant() == grant() and hash(grant()) == hash(grant())
    assert grant() != grant(env="1")
    assert grant() != grant(read_only=False)
    assert ContainerGrant(annotations={"a": "b"}) != ContainerGrant(envs={"a": "b"})


def test_equal_answers_share_the_first_object_and_different_ones_do_not() -> None:
    equal = Equal()
    first = grant()
    assert equal(first) is first
    assert equal(grant()) is first
    other = grant(env="1")
    assert equal(other) is other


def test_the_kept_grants_are_bounded() -> None:
    equal = Equal()
    for n in range(Equal.LIMIT + 10):
        equal(grant(env=str(n)))
    assert len(equal._seen) <= Equal.LIMIT

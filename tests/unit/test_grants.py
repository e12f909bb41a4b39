"""Grants compared and kept by value: equal answers of a driver share one object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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


# Few names, so that independently drawn grants are often equal too.
_NAMES = st.sampled_from(["A", "B", "C", ""])
_MAPS = st.dictionaries(_NAMES, _NAMES, max_size=3)
GRANTS = st.builds(
    ContainerGrant,
    envs=_MAPS,
    mounts=st.lists(st.builds(Mount, _NAMES, _NAMES, st.booleans()), max_size=2).map(tuple),
    device_nodes=st.lists(st.builds(DeviceNode, _NAMES, _NAMES, _NAMES), max_size=2).map(tuple),
    annotations=_MAPS,
    cdi_devices=st.lists(_NAMES, max_size=2).map(tuple),
)


def _reordered(grant: ContainerGrant) -> st.SearchStrategy[ContainerGrant]:
    """The same grant built again, its envs and annotations inserted in any order."""

    def shuffled(mapping: Mapping[str, str]) -> st.SearchStrategy[dict[str, str]]:
        return st.permutations(list(mapping.items())).map(dict)

    return st.builds(
        replace, st.just(grant), envs=shuffled(grant.envs), annotations=shuffled(grant.annotations)
    )


def _value(grant: ContainerGrant) -> tuple[Any, ...]:
    return dict(grant.envs), grant.mounts, grant.device_nodes, dict(grant.annotations), grant.cdi_devices


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(GRANTS.flatmap(lambda a: st.tuples(st.just(a), st.one_of(_reordered(a), GRANTS))))
def test_equal_grants_hash_alike_whatever_order_their_mappings_were_built_in(
    pair: tuple[ContainerGrant, ContainerGrant],
) -> None:
    """Equality is by value (mappings in any order), and hashing agrees with it: Equal keeps
    grants in a dict, so two equal grants hashing apart would be two entries, not one object."""
    a, b = pair
    assert (a == b) == (_value(a) == _value(b))
    if a == b:
        assert hash(a) == hash(b)
        equal = Equal()
        assert equal(a) is a and equal(b) is a

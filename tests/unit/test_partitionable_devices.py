"""Partitionable devices (protocol 1.3): counter sets and their consumption read from a driver as
the API server checks them, and published in 1.36's shape.

Facts from k8s.io/api resource/v1 types.go and k8s.io/kubernetes pkg/apis/resource/validation at
1.37: a slice holds devices or `sharedCounters` (at most 8 sets), never both; a set's name and
its counters' names are DNS labels, at most 32 counters; a device's `consumesCounters` (at most 2,
beside its attributes, under `basic` in v1beta1) names a set and amounts as `{value: q}`; 64
devices a slice once one consumes counters. 1.33-1.35 had the sets in the devices' own slice.
"""

from __future__ import annotations

from typing import Any

import pytest

from shim.dra.slices import PARTITIONS, Pool, PoolDevice, dropped, spec, spec_hash
from shim.driverhost import protocol
from shim.driverhost.protocol import DriverProtocolError
from shim.model import CounterSet, Device
from shim.sdk import types
from shim.sdk.codec import device_json

GPU_SET = {"name": "gpu-0", "counters": {"memory": "80Gi", "slices": "7"}}
WHOLE = {"counter_set": "gpu-0", "counters": {"memory": "80Gi", "slices": "7"}}
HALF = {"counterSet": "gpu-0", "counters": {"memory": "40Gi", "slices": "3"}}  # camelCase too


def test_a_drivers_counters_arrive_sorted_by_counter() -> None:
    device, _ = protocol.device_from_json(
        {"id": "gpu-0", "health": "HEALTHY", "counter_sets": [GPU_SET], "consumes_counters": [WHOLE]}
    )
    counters = (("memory", "80Gi"), ("slices", "7"))
    assert device.counter_sets == (CounterSet("gpu-0", counters),)
    assert device.consumes_counters == (CounterSet("gpu-0", counters),)
    half, _ = protocol.device_from_json({"id": "gpu-0-a", "health": "HEALTHY", "consumesCounters": [HALF]})
    assert half.consumes_counters == (CounterSet("gpu-0", (("memory", "40Gi"), ("slices", "3"))),)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"counter_sets": {"gpu-0": {}}}, "counter_sets must be a list of at most 8"),
        ({"counter_sets": [GPU_SET] * 9}, "counter_sets must be a list of at most 8"),
        ({"consumes_counters": [WHOLE, HALF, WHOLE]}, "consumes_counters must be a list of at most 2"),
        ({"counter_sets": [{"name": "GPU_0", "counters": {"m": "1"}}]}, "name 'GPU_0' is not a DNS label"),
        ({"counter_sets": [{"name": "g", "counters": {}}]}, r"counters must map 1 to 32"),
        ({"counter_sets": [{"name": "g", "counters": {f"c{i}": "1" for i in range(33)}}]}, "1 to 32"),
        ({"counter_sets": [{"name": "g", "counters": {"Mem": "1"}}]}, "counter 'Mem' is not a DNS label"),
        ({"counter_sets": [{"name": "g", "counters": {"mem": "-1"}}]}, "'-1' is not a quantity"),
        ({"counter_sets": [{"name": "g", "counters": {"mem": 1}}]}, "must be a quantity"),
        ({"consumes_counters": [{"counters": {"m": "1"}}]}, "counter_set None is not a DNS label"),
        ({"counter_sets": [GPU_SET, GPU_SET]}, "a counter set is named twice"),
    ],
)
def test_counters_the_api_server_would_refuse_refuse_the_list(extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(DriverProtocolError, match=rf"device 'gpu-0': .*{fragment}"):
        protocol.device_from_json({"id": "gpu-0", "health": "HEALTHY", **extra})


def test_the_sdk_writes_counters_and_refuses_bad_ones_where_they_are_made() -> None:
    device = types.Device(
        id="gpu-0",
        counter_sets=[types.CounterSet(name="gpu-0", counters={"memory": "80Gi"})],
        consumes_counters=[types.CounterConsumption(counter_set="gpu-0", counters={"memory": "80Gi"})],
    )
    written = device_json(device)
    assert written["counter_sets"] == [{"name": "gpu-0", "counters": {"memory": "80Gi"}}]
    assert written["consumes_counters"] == [{"counter_set": "gpu-0", "counters": {"memory": "80Gi"}}]
    with pytest.raises(ValueError, match="device 'gpu-0': counter_sets\\[0\\] \\(gpu-0\\): counter 'Memory'"):
        device_json(
            types.Device(id="gpu-0", counter_sets=[types.CounterSet(name="gpu-0", counters={"Memory": "1"})])
        )


SET = CounterSet("gpu-0", (("memory", "80Gi"),))
TAKES = (CounterSet("gpu-0", (("memory", "40Gi"),)),)


def partitioned(partitions: bool = True) -> Pool:
    devices = [Device("gpu-0", counter_sets=(SET,), consumes_counters=(CounterSet("gpu-0", SET.counters),))]
    devices += [Device(f"gpu-0-{p}", consumes_counters=TAKES) for p in "ab"]
    return (
        Pool.of("gpu.example.com", "node-a", devices)
        if partitions
        else Pool.named(
            "gpu.example.com",
            "node-a",
            Pool.of("gpu.example.com", "node-a", devices).devices,
            partitions=False,
        )
    )


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_counter_sets_get_a_slice_of_their_own_and_devices_say_what_they_take(version: str) -> None:
    pool = partitioned()
    devices, counters = pool.chunks()
    assert [d.name for d in devices if not isinstance(d, CounterSet)] == ["gpu-0", "gpu-0-a", "gpu-0-b"]
    assert spec(pool, counters, 1, 2, version) == {
        "driver": "gpu.example.com",
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 2},
        "nodeName": "node-a",
        "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}],
    }
    [_, half, _] = spec(pool, devices, 1, 2, version)["devices"]
    described = half["basic"] if version == "v1beta1" else half
    assert described["consumesCounters"] == [
        {"counterSet": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}
    ]


def test_sets_go_eight_a_slice_devices_64_once_one_consumes_and_a_set_named_twice_is_the_first() -> None:
    devices = [
        Device(f"d{i:03}", counter_sets=(CounterSet(f"s{i % 10}", (("m", "1"),)),)) for i in range(100)
    ]
    devices += [Device("z-takes", consumes_counters=(CounterSet("s0", (("m", "1"),)),))]
    pool = Pool.of("gpu.example.com", "node-a", devices)
    assert [len(c) for c in pool.chunks()] == [64, 37, 8, 2]
    assert [c.name for c in pool.counter_sets()] == [f"s{i}" for i in range(10)]


def test_a_pool_not_published_with_counters_says_so_and_hashes_what_it_writes() -> None:
    on, off = partitioned(), partitioned(partitions=False)
    assert len(off.chunks()) == 1 and "consumesCounters" not in str(spec(off, off.chunks()[0], 1, 1, "v1"))
    assert off.counters_unpublished() and not on.counters_unpublished()
    assert spec_hash(on, on.chunks()[0], 1, 2) != spec_hash(off, off.chunks()[0], 1, 1)


def test_a_server_that_drops_counters_is_found_out() -> None:
    pool = partitioned()
    devices, counters = pool.chunks()
    sent = spec(pool, counters, 1, 2, "v1")
    assert dropped(sent, {k: v for k, v in sent.items() if k != "sharedCounters"}, "v1") == [PARTITIONS]
    sent = spec(pool, devices, 1, 2, "v1")
    stripped = {**sent, "devices": [{"name": d["name"]} for d in sent["devices"]]}
    assert dropped(sent, stripped, "v1") == [PARTITIONS]
    assert dropped(sent, sent, "v1") == []


def test_a_driver_listed_later_can_neither_redefine_nor_use_up_anothers_counter_set() -> None:
    """Counter sets are owned as device names are (shim/dra/ownership.py): the first resource in
    the configured order keeps a set's name, whatever its devices are called; a hostile driver's
    resource listed later that brings a set of that name, with more in it, loses it, and its
    devices' consumption of it is not published."""
    honest = [
        PoolDevice("z-gpu", Device("z-gpu", counter_sets=(SET,)), "example.com/gpu"),
        PoolDevice("z-gpu-a", Device("z-gpu-a", consumes_counters=TAKES), "example.com/gpu"),
    ]
    bigger = CounterSet("gpu-0", (("memory", "1Ti"),))
    hostile = [
        PoolDevice(
            "a-evil", Device("a-evil", counter_sets=(bigger,), consumes_counters=TAKES), "example.com/evil"
        )
    ]
    pool = Pool.named("gpu.example.com", "node-a", [*honest, *hostile])
    assert pool.counter_sets() == (SET,)
    by_name = {d.name: d.device for d in pool.devices}
    assert by_name["a-evil"].counter_sets == () and by_name["a-evil"].consumes_counters == ()
    assert by_name["z-gpu-a"].consumes_counters == TAKES
    # A consumer of a set nobody brings now (its device held by a container) keeps it: unallocatable.
    alone = Pool.named("gpu.example.com", "node-a", honest[1:])
    assert alone.devices[0].device.consumes_counters == TAKES


# --- 1.33-1.35's shape: each set in the slice of the devices consuming it (the alpha gate) -------


def beside(devices: list[Device]) -> Pool:
    return Pool.named(
        "gpu.example.com", "node-a", Pool.of("gpu.example.com", "node-a", devices).devices, beside=True
    )


def gpu(n: int, counters: int = 1) -> list[Device]:
    """GPU n bringing set gpu-n of ``counters`` counters, taking all of it, and two halves."""
    whole = CounterSet(f"gpu-{n}", tuple((f"c{i}", "2") for i in range(counters)))
    half = CounterSet(f"gpu-{n}", tuple((f"c{i}", "1") for i in range(counters)))
    return [
        Device(f"gpu-{n}", counter_sets=(whole,), consumes_counters=(whole,)),
        *(Device(f"gpu-{n}-{p}", consumes_counters=(half,)) for p in "ab"),
    ]


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_before_1_36_each_set_shares_a_slice_with_its_consumers_and_the_rest_have_their_own(
    version: str,
) -> None:
    pool = beside([*gpu(0), *gpu(1), Device("plain")])
    mixed, plain = pool.chunks()
    assert [c.name for c in mixed] == [
        "gpu-0",
        "gpu-0-a",
        "gpu-0-b",
        "gpu-1",
        "gpu-1-a",
        "gpu-1-b",
        "gpu-0",
        "gpu-1",
    ]
    written = spec(pool, mixed, 1, 2, version)
    assert [c["name"] for c in written["sharedCounters"]] == ["gpu-0", "gpu-1"]
    takes = [d.get("basic", d)["consumesCounters"][0]["counterSet"] for d in written["devices"]]
    assert takes == ["gpu-0", "gpu-0", "gpu-0", "gpu-1", "gpu-1", "gpu-1"]
    assert [d["name"] for d in spec(pool, plain, 1, 2, version)["devices"]] == ["plain"]


def test_before_1_36_sets_fill_a_slice_up_to_32_counters_then_take_another() -> None:
    pool = beside([*gpu(0, counters=20), *gpu(1, counters=20)])  # 40 counters: two slices
    assert [sorted({c.name for c in chunk if isinstance(c, CounterSet)}) for chunk in pool.chunks()] == [
        ["gpu-0"], ["gpu-1"]]  # fmt: skip


def test_before_1_36_a_set_and_its_consumers_past_one_slice_publish_no_counters() -> None:
    # One device consuming two sets of 20 counters each: they must share a slice of 32 at most.
    a, b = (
        CounterSet("a", tuple((f"c{i}", "2") for i in range(20))),
        CounterSet("b", tuple((f"c{i}", "2") for i in range(20))),
    )
    both = CounterSet("a", (("c0", "1"),)), CounterSet("b", (("c0", "1"),))
    pool = beside(
        [
            Device("gpu-a", counter_sets=(a,)),
            Device("gpu-b", counter_sets=(b,)),
            Device("both", consumes_counters=both),
        ]
    )
    assert not pool.partitions and pool.counters_unpublished()
    assert all(not isinstance(c, CounterSet) for chunk in pool.chunks() for c in chunk)


def test_before_1_36_a_consumer_of_a_set_nobody_brings_is_left_out() -> None:
    orphan = Device("orphan", consumes_counters=(CounterSet("gone", (("c0", "1"),)),))
    pool = beside([*gpu(0), orphan])
    assert "orphan" not in [c.name for chunk in pool.chunks() for c in chunk]

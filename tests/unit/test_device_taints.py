"""Device taints (protocol 1.3): read from a driver as the API server checks them, published in
each resource.k8s.io version's shape, and found missing when an API server drops them.

Facts from k8s.io/api resource/<version>/types.go and k8s.io/kubernetes
pkg/apis/resource/validation (1.33, 1.34, 1.37): `taints` beside the attributes (under `basic`
before v1beta2), key a label name, value a label value, effect NoSchedule or NoExecute (None only
from 1.35), 4 per device before 1.35, and 64 devices a slice once one is tainted (1.37).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from shim.dra.slices import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS,
    Pool,
    dropped,
    spec,
    spec_hash,
)
from shim.driverhost import protocol
from shim.driverhost.protocol import DriverProtocolError
from shim.driverprotocol import taints_from_json
from shim.model import Device, DeviceTaint
from shim.sdk import types
from shim.sdk.codec import device_json

GOING = {"key": "gpu.example.com/going-away", "value": "firmware", "effect": "NoSchedule"}


def test_a_drivers_taints_arrive_in_its_order() -> None:
    device, _ = protocol.device_from_json(
        {"id": "gpu-0", "health": "HEALTHY", "taints": [GOING, {"key": "ecc", "effect": "NoExecute"}]}
    )
    assert device.taints == (
        DeviceTaint("gpu.example.com/going-away", "firmware", "NoSchedule"),
        DeviceTaint("ecc", "", "NoExecute"),
    )


@pytest.mark.parametrize(
    ("taints", "fragment"),
    [
        ({"key": "a"}, "taints must be a list"),
        ([GOING] * 5, "5 taints; at most 4"),
        (["ecc"], r"taints\[0\] must be an object"),
        ([{"effect": "NoSchedule"}], r"taints\[0\]: key None is not a label name"),
        ([{"key": "-bad", "effect": "NoSchedule"}], "key '-bad' is not a label name"),
        ([{"key": "UPPER.example.com/x", "effect": "NoSchedule"}], "is not a label name"),
        ([{"key": "a" * 64, "effect": "NoSchedule"}], "is not a label name"),
        ([{"key": "ok", "value": "has space", "effect": "NoSchedule"}], "is not a label value"),
        ([{"key": "ok", "value": 3, "effect": "NoSchedule"}], "is not a label value"),
        ([{"key": "ok", "effect": "None"}], "effect 'None' is not one of NoSchedule, NoExecute"),
        ([{"key": "ok", "effect": "PreferNoSchedule"}], "is not one of"),
        ([{"key": "ok"}], "effect None is not one of"),
    ],
)
def test_a_taint_the_api_server_would_refuse_refuses_the_list_naming_it(taints: Any, fragment: str) -> None:
    with pytest.raises(DriverProtocolError, match=rf"device 'gpu-0': .*{fragment}"):
        protocol.device_from_json({"id": "gpu-0", "health": "HEALTHY", "taints": taints})


def test_label_rules_take_what_the_api_server_takes() -> None:
    longest = f"{'a' * 63}.example.com/{'k' * 63}"
    assert taints_from_json([{"key": longest, "value": "v" * 63, "effect": "NoExecute"}])[0].key == longest
    assert taints_from_json([{"key": "A_b.c-9", "value": "", "effect": "NoSchedule"}])


def test_the_sdk_writes_taints_and_refuses_a_bad_one_where_it_is_made() -> None:
    device = types.Device(id="gpu-0", taints=[types.DeviceTaint(key="ecc", effect="NoExecute")])
    assert device_json(device)["taints"] == [{"key": "ecc", "value": "", "effect": "NoExecute"}]
    with pytest.raises(ValueError, match="device 'gpu-0': taints\\[0\\]: effect 'Evict'"):
        device_json(types.Device(id="gpu-0", taints=[types.DeviceTaint(key="ecc", effect="Evict")]))


TAINTED = Device("gpu-0", taints=(DeviceTaint("ecc", "", "NoExecute"), DeviceTaint("k", "v", "NoSchedule")))
V1_TAINTS = [{"key": "ecc", "effect": "NoExecute"}, {"key": "k", "value": "v", "effect": "NoSchedule"}]


@pytest.mark.parametrize(
    ("version", "device"),
    [
        ("v1", {"name": "gpu-0", "taints": V1_TAINTS}),
        ("v1beta2", {"name": "gpu-0", "taints": V1_TAINTS}),
        ("v1beta1", {"name": "gpu-0", "basic": {"taints": V1_TAINTS}}),
        ("v1alpha3", {"name": "gpu-0", "basic": {"taints": V1_TAINTS}}),
    ],
)
def test_taints_sit_beside_the_attributes_in_each_version(version: str, device: dict[str, Any]) -> None:
    pool = Pool.of("gpu.example.com", "node-a", [TAINTED])
    assert spec(pool, pool.chunks()[0], 1, 1, version)["devices"] == [device]


def test_a_pool_with_a_tainted_device_splits_at_64_a_slice() -> None:
    devices = [Device(f"d{i:03}") for i in range(200)]
    plain = Pool.of("gpu.example.com", "node-a", devices)
    assert [len(c) for c in plain.chunks()] == [MAX_DEVICES_PER_SLICE, 72]
    devices[150] = Device("d150", taints=(DeviceTaint("ecc"),))
    tainted = Pool.of("gpu.example.com", "node-a", devices)
    assert [len(c) for c in tainted.chunks()] == [MAX_DEVICES_PER_SLICE_WITH_TAINTS] * 3 + [8]


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_a_server_that_drops_the_taints_is_found_out(version: str) -> None:
    pool = Pool.of("gpu.example.com", "node-a", [TAINTED, Device("gpu-1")])
    sent = spec(pool, pool.chunks()[0], 1, 1, version)
    kept = {**sent, "devices": [dict(d) for d in sent["devices"]]}
    assert dropped(sent, kept, version) == []
    stripped = spec(
        Pool.of("gpu.example.com", "node-a", [Device("gpu-0"), Device("gpu-1")]), (), 1, 1, version
    )
    stripped["devices"] = [{"name": "gpu-0"} if version == "v1" else {"name": "gpu-0", "basic": {}}]
    assert dropped(sent, stripped, version) == ["DRADeviceTaints"]
    assert dropped(sent, None, version) == ["DRADeviceTaints"]  # an answer without a spec
    untainted = spec(Pool.of("gpu.example.com", "node-a", [Device("gpu-1")]), (), 1, 1, version)
    assert dropped(untainted, untainted, version) == []


def test_the_content_hash_sees_a_taint() -> None:
    plain = Pool.of("gpu.example.com", "node-a", [Device("gpu-0")])
    tainted = Pool.of("gpu.example.com", "node-a", [TAINTED])
    assert spec_hash(plain, plain.devices, 1, 1) != spec_hash(tainted, tainted.devices, 1, 1)


def test_the_sims_config_refuses_a_taint_devshim_would_refuse() -> None:
    from adapters.sim.config import ConfigError, load_config

    good = {"resources": [{"name": "example.com/gpu", "devices": [{"id": "g0", "taints": [GOING]}]}]}
    devices = load_config(inline_json=json.dumps(good)).resources[0].devices
    assert devices is not None and devices[0].taints == [GOING]
    bad = {"resources": [{"name": "example.com/gpu", "devices": [{"id": "g0", "taints": [{"key": "k"}]}]}]}
    with pytest.raises(ConfigError, match="effect None is not one of NoSchedule, NoExecute"):
        load_config(inline_json=json.dumps(bad))

"""The kept encodings are exactly protobuf's own: ListEncoder's ListAndWatchResponse, for both
versions, also after devices change, appear, vanish or repeat (the encoder reuses records), and
GrantEncoder's AllocateResponse, for grants seen before or not."""

from __future__ import annotations

import random

import pytest

from shim.deviceplugin.common import device_from_model, grant_from_model, list_from_model
from shim.deviceplugin.encoded import GrantEncoder, ListEncoder, _varint
from shim.generated.v1beta1 import api_pb2 as v1beta1
from shim.generated.v1beta2 import api_pb2 as v1beta2
from shim.model import ContainerGrant, Device, DeviceNode, Health, Mount


def random_devices(rng: random.Random, count: int) -> list[Device]:
    return [
        Device(
            f"dev-{rng.randrange(10**6)}" + "x" * rng.randrange(200),  # ids long enough for 2-byte lengths
            rng.choice([Health.HEALTHY, Health.UNHEALTHY]),
            tuple(rng.sample(range(8), rng.randrange(3))),
        )
        for _ in range(count)
    ]


@pytest.mark.parametrize("pb", [v1beta1, v1beta2], ids=["v1beta1", "v1beta2"])
def test_encoded_lists_equal_protobufs_own_encoding_through_changes(pb: object) -> None:
    rng = random.Random(7)
    encoder = ListEncoder(pb, device_from_model)  # type: ignore[arg-type]
    devices = random_devices(rng, 300)
    for _ in range(20):
        expected = list_from_model(pb, devices).SerializeToString()  # type: ignore[arg-type]
        encoded = encoder.encode(devices)
        assert encoded == expected
        assert pb.ListAndWatchResponse.FromString(encoded) == list_from_model(pb, devices)  # type: ignore[attr-defined,arg-type]
        i = rng.randrange(len(devices))
        devices[i] = Device(
            devices[i].id,
            Health.UNHEALTHY if devices[i].health is Health.HEALTHY else Health.HEALTHY,
            devices[i].numa_nodes,
        )
        devices = devices[1:] + random_devices(rng, 2) + devices[:1]  # vanish, appear, reorder
    copies = [Device(d.id, d.health, d.numa_nodes) for d in devices]  # equal values, new objects
    assert encoder.encode(copies) == list_from_model(pb, copies).SerializeToString()  # type: ignore[arg-type]
    assert encoder.encode([]) == b"" == list_from_model(pb, []).SerializeToString()  # type: ignore[arg-type]
    assert encoder.encode(devices[:1] * 3) == list_from_model(pb, devices[:1] * 3).SerializeToString()  # type: ignore[arg-type]


def random_grant(rng: random.Random) -> ContainerGrant:
    n = rng.randrange(4)
    return ContainerGrant(
        envs={f"E{i}": "v" * rng.randrange(300) for i in range(n)},
        mounts=tuple(Mount(f"/c{i}", f"/h{i}", rng.random() < 0.5) for i in range(rng.randrange(3))),
        device_nodes=tuple(DeviceNode(f"/dev/x{i}", f"/dev/x{i}", "rw") for i in range(n)),
        annotations={f"a/{i}": str(i) for i in range(rng.randrange(3))},
        cdi_devices=tuple(f"vendor.com/gpu=gpu{i}" for i in range(rng.randrange(3))),
    )


@pytest.mark.parametrize("pb", [v1beta1, v1beta2], ids=["v1beta1", "v1beta2"])
def test_encoded_allocate_responses_equal_protobufs_own_encoding(pb: object) -> None:
    rng = random.Random(11)
    encoder = GrantEncoder(pb, grant_from_model)  # type: ignore[arg-type]
    grants = [random_grant(rng) for _ in range(40)]
    for _ in range(60):
        chosen = rng.choices(grants + [random_grant(rng)], k=rng.randrange(3))  # seen before, or new
        expected = pb.AllocateResponse(  # type: ignore[attr-defined]
            container_responses=[grant_from_model(pb, g) for g in chosen]  # type: ignore[arg-type]
        ).SerializeToString()
        got = encoder.encode(chosen)
        # Map entries have no order on the wire (protobuf may write them in any): compare parsed.
        assert pb.AllocateResponse.FromString(got) == pb.AllocateResponse.FromString(expected)  # type: ignore[attr-defined]
        assert len(got) == len(expected)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (2**21, b"\x80\x80\x80\x01"),
    ],
)
def test_varints_follow_the_protobuf_encoding(value: int, encoded: bytes) -> None:
    assert _varint(value) == encoded

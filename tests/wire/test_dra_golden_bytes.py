"""Golden wire bytes for every message of the kubelet's DRA gRPC APIs (DRAPlugin v1beta1 and
v1, DRAResourceHealth v1alpha1 and v1).

As in tests/wire/test_golden_bytes.py, the expected bytes are written by hand from the
protobuf encoding rules and the facts in tests/wire/upstream_facts.py, never produced by a
helper:

* tag = (field_number << 3) | wire_type, one byte for fields 1..15; wire type 0 = VARINT
  (bool, int64, enum), 2 = LEN (string, message, map entry).
* proto3 omits singular fields holding their default (0, "", the enum's 0 value), except a
  field declared ``optional`` (DRA v1 Device.share_id): set, it is written even when "".
* a set submessage is written even when empty (length 0); repeated messages and strings
  repeat the tag per element.
* a map<string,Message> entry is a LEN record holding {key = 1; value = 2}, both always
  written (an empty value message is ``12 00``), as protobuf-go and upb both encode it.
* an enum is its number as a VARINT; proto3 enums are open, so a number the reader does not
  know is kept as that number.

The wire of a message does not contain its package, so DRAPlugin v1beta1 and v1 share their
hand bytes (one list, applied to both versions), and so do the two health versions; the few
v1-only cases (share_id) are listed apart. Each case is (API, message, values, bytes): it
asserts that the hand bytes parse to the values and that the values serialize to exactly the
hand bytes (deterministic: maps sorted by key). The API key is the upstream directory, as in
upstream_facts.UPSTREAM: the package alone cannot name the module, since DRA health v1 and
PodResources v1 share the package "v1".
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from shim.generated.dra.v1 import api_pb2 as dra_v1
from shim.generated.dra.v1beta1 import api_pb2 as dra_v1beta1
from shim.generated.drahealth.v1 import api_pb2 as health_v1
from shim.generated.drahealth.v1alpha1 import api_pb2 as health_v1alpha1

from .upstream_facts import UPSTREAM

# Upstream API directory -> our generated module (our layout, not an upstream fact).
MODULES: dict[str, ModuleType] = {
    "dra/v1beta1": dra_v1beta1,
    "dra/v1": dra_v1,
    "dra-health/v1alpha1": health_v1alpha1,
    "dra-health/v1": health_v1,
}
DRA_PLUGIN_APIS = ("dra/v1beta1", "dra/v1")
DRA_HEALTH_APIS = ("dra-health/v1alpha1", "dra-health/v1")

CLAIM_DEFAULT_UID_1_GPU = (
    b"\x0a\x07default"  # namespace: field 1, LEN: (1 << 3) | 2 = 0x0a; len 7
    b"\x12\x05uid-1"  # uid: field 2, LEN: (2 << 3) | 2 = 0x12; len 5
    b"\x1a\x03gpu"  # name: field 3, LEN: (3 << 3) | 2 = 0x1a; len 3  (9 + 7 + 5 = 21 bytes)
)
TWO_CLAIMS = (
    b"\x0a\x15" + CLAIM_DEFAULT_UID_1_GPU  # claims[0]: field 1, LEN 0x0a; len 21 = 0x15
    + b"\x0a\x0c"  # claims[1]: field 1 again (one record per element); len 4 + 4 + 4 = 12 = 0x0c
    b"\x0a\x02ns\x12\x02u2\x1a\x02c2"  # Claim{namespace "ns", uid "u2", name "c2"}
)  # fmt: skip
TWO_CLAIMS_VALUES = {
    "claims": [
        {"namespace": "default", "uid": "uid-1", "name": "gpu"},
        {"namespace": "ns", "uid": "u2", "name": "c2"},
    ]
}

# (message, values, hand bytes, id suffix): the same wire in DRAPlugin v1beta1 and v1.
DRA_PLUGIN_CASES: list[tuple[str, dict[str, Any], bytes, str]] = [
    ("Claim", {"namespace": "default", "uid": "uid-1", "name": "gpu"}, CLAIM_DEFAULT_UID_1_GPU, ""),
    ("Claim", {}, b"", "-empty"),
    ("NodePrepareResourcesRequest", TWO_CLAIMS_VALUES, TWO_CLAIMS, "-two-claims"),
    ("NodePrepareResourcesRequest", {"claims": [{}]}, b"\x0a\x00", "-one-empty-claim-is-a-record"),
    ("NodeUnprepareResourcesRequest", TWO_CLAIMS_VALUES, TWO_CLAIMS, "-two-claims"),
    (
        "Device",
        {
            "request_names": ["gpu"],
            "pool_name": "node-a",
            "device_name": "gpu-0",
            "cdi_device_ids": ["vendor.com/gpu=gpu0"],
        },
        b"\x0a\x03gpu"  # request_names[0]: field 1, LEN 0x0a; len 3
        b"\x12\x06node-a"  # pool_name: field 2, LEN 0x12; len 6
        b"\x1a\x05gpu-0"  # device_name: field 3, LEN 0x1a; len 5
        b"\x22\x13vendor.com/gpu=gpu0",  # cdi_device_ids[0]: field 4, LEN: (4 << 3) | 2 = 0x22; len 19
        "",
    ),
    (
        "Device",
        {"request_names": ["a", "b"], "cdi_device_ids": ["x", "y"]},
        b"\x0a\x01a\x0a\x01b"  # request_names: field 1, LEN 0x0a, once per element (never packed)
        b"\x22\x01x\x22\x01y",  # cdi_device_ids: field 4, LEN 0x22, once per element
        "-repeated-strings",
    ),
    (
        "NodePrepareResourceResponse",
        {"devices": [{"pool_name": "p", "device_name": "d"}, {}], "error": "e"},
        b"\x0a\x06"  # devices[0]: field 1, LEN 0x0a; len 3 + 3 = 6
        b"\x12\x01p\x1a\x01d"  # Device{pool_name (0x12) "p", device_name (0x1a) "d"}
        b"\x0a\x00"  # devices[1]: an empty Device is still one record, len 0
        b"\x12\x01e",  # error: field 2, LEN 0x12; len 1
        "",
    ),
    ("NodePrepareResourceResponse", {"error": "boom"}, b"\x12\x04boom", "-error-only"),
    (
        "NodePrepareResourcesResponse",
        {
            "claims": {
                "uid-1": {
                    "devices": [{"pool_name": "p", "device_name": "d", "cdi_device_ids": ["v.com/g=0"]}]
                }
            }
        },
        b"\x0a\x1c"  # claims entry: field 1, LEN 0x0a; len 7 + 21 = 28 = 0x1c
        b"\x0a\x05uid-1"  # entry key: field 1, LEN 0x0a; len 5
        b"\x12\x13"  # entry value: field 2, LEN 0x12; len 2 + 17 = 19 = 0x13 (NodePrepareResourceResponse)
        b"\x0a\x11"  # NodePrepareResourceResponse.devices[0]: field 1, LEN 0x0a; len 3 + 3 + 11 = 17 = 0x11
        b"\x12\x01p\x1a\x01d"  # Device.pool_name (0x12), Device.device_name (0x1a)
        b"\x22\x09v.com/g=0",  # Device.cdi_device_ids[0]: field 4, LEN 0x22; len 9
        "-one-claim",
    ),
    (
        "NodePrepareResourcesResponse",
        {"claims": {"u2": {"error": "no"}, "u1": {}}},
        b"\x0a\x06\x0a\x02u1\x12\x00"  # entry "u1": len 6 = {key 0x0a "u1", value 0x12 len 0 (empty message)}
        b"\x0a\x0a\x0a\x02u2"  # entry "u2" (second: sorted by key): len 4 + 6 = 10 = 0x0a; key "u2"
        b"\x12\x04\x12\x02no",  # value: field 2, LEN 0x12; len 4 = {error: field 2, LEN 0x12, "no"}
        "-two-claims-empty-value-written",
    ),
    ("NodeUnprepareResourceResponse", {"error": "busy"}, b"\x0a\x04busy", ""),
    ("NodeUnprepareResourceResponse", {}, b"", "-success-is-empty"),
    (
        "NodeUnprepareResourcesResponse",
        {"claims": {"uid-1": {}, "uid-2": {"error": "busy"}}},
        b"\x0a\x09\x0a\x05uid-1\x12\x00"  # entry "uid-1": len 7 + 2 = 9; value = empty message, still written
        b"\x0a\x0f\x0a\x05uid-2"  # entry "uid-2": len 7 + 8 = 15 = 0x0f; key "uid-2"
        b"\x12\x06\x0a\x04busy",  # value: field 2, LEN 0x12; len 6 = {error: field 1, LEN 0x0a, "busy"}
        "-two-claims",
    ),
]

# DRAPlugin v1 only: Device.share_id, `optional string share_id = 5` (explicit presence).
DRA_V1_ONLY_CASES: list[tuple[str, dict[str, Any], bytes, str]] = [
    (
        "Device",
        {
            "request_names": ["r"],
            "pool_name": "p",
            "device_name": "d",
            "cdi_device_ids": ["c"],
            "share_id": "s-1",
        },
        b"\x0a\x01r\x12\x01p\x1a\x01d\x22\x01c"  # fields 1..4 as in v1beta1
        b"\x2a\x03s-1",  # share_id: field 5, LEN: (5 << 3) | 2 = 0x2a; len 3
        "-share-id",
    ),
    (
        "Device",
        {"device_name": "d", "share_id": ""},
        b"\x1a\x01d"  # device_name: field 3, LEN 0x1a
        b"\x2a\x00",  # share_id set to "": explicit presence writes it (field 5, LEN, len 0)
        "-share-id-set-empty-is-written",
    ),
]

DEVICE_HEALTH_ALL_FIELDS = (
    b"\x0a\x06"  # device: field 1, LEN 0x0a; len 6
    b"\x0a\x01p\x12\x01d"  # DeviceIdentifier{pool_name (0x0a) "p", device_name (0x12) "d"}
    b"\x10\x01"  # health: field 2, VARINT: (2 << 3) | 0 = 0x10; HEALTHY = 1
    b"\x18\x80\xe2\xcf\xaa\x06"  # last_updated_time: field 3, VARINT 0x18; 1700000000 (5-byte varint)
    b"\x20\x1e"  # health_check_timeout_seconds: field 4, VARINT: (4 << 3) | 0 = 0x20; 30 = 0x1e
    b"\x2a\x02ok"  # message: field 5, LEN: (5 << 3) | 2 = 0x2a; len 2
)

# (message, values, hand bytes, id suffix): the same wire in DRAResourceHealth v1alpha1 and v1.
DRA_HEALTH_CASES: list[tuple[str, dict[str, Any], bytes, str]] = [
    ("NodeWatchResourcesRequest", {}, b"", ""),
    (
        "DeviceIdentifier",
        {"pool_name": "node-a", "device_name": "gpu-0"},
        b"\x0a\x06node-a"  # pool_name: field 1, LEN 0x0a; len 6
        b"\x12\x05gpu-0",  # device_name: field 2, LEN 0x12; len 5
        "",
    ),
    (
        "DeviceHealth",
        {
            "device": {"pool_name": "p", "device_name": "d"},
            "health": "HEALTHY",
            "last_updated_time": 1700000000,
            "health_check_timeout_seconds": 30,
            "message": "ok",
        },
        DEVICE_HEALTH_ALL_FIELDS,
        "-all-fields",
    ),
    (
        "DeviceHealth",
        {"health": "UNKNOWN", "device": {}},
        b"\x0a\x00",  # device set but empty: field 1, LEN, len 0; health UNKNOWN = 0 is not written
        "-unknown-is-default-and-not-written",
    ),
    (
        "DeviceHealth",
        {"health": "UNHEALTHY", "health_check_timeout_seconds": -1},
        b"\x10\x02"  # health: field 2, VARINT 0x10; UNHEALTHY = 2
        b"\x20\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # timeout -1: int64 sign-extended, 10-byte varint
        "-unhealthy-negative-timeout",
    ),
    (
        "NodeWatchResourcesResponse",
        {
            "devices": [
                {"device": {"pool_name": "p", "device_name": "d0"}, "health": "UNHEALTHY"},
                {"device": {"pool_name": "p", "device_name": "d1"}},
            ]
        },
        b"\x0a\x0b"  # devices[0]: field 1, LEN 0x0a; len 9 + 2 = 11 = 0x0b
        b"\x0a\x07\x0a\x01p\x12\x02d0"  # DeviceHealth.device: field 1, LEN; len 7 = {pool "p", device "d0"}
        b"\x10\x02"  # DeviceHealth.health: UNHEALTHY = 2
        b"\x0a\x09"  # devices[1]: field 1 again; len 9 (health UNKNOWN is not written)
        b"\x0a\x07\x0a\x01p\x12\x02d1",  # DeviceHealth.device = {pool "p", device "d1"}
        "-two-devices",
    ),
    (
        "NodeWatchResourcesResponse",
        {
            "devices": [
                {
                    "device": {"pool_name": "p", "device_name": "d"},
                    "health": "HEALTHY",
                    "last_updated_time": 1700000000,
                    "health_check_timeout_seconds": 30,
                    "message": "ok",
                }
            ]
        },
        # devices[0]: field 1, LEN 0x0a; len 8 + 2 + 6 + 2 + 4 = 22 = 0x16
        b"\x0a\x16" + DEVICE_HEALTH_ALL_FIELDS,
        "-one-device-all-fields",
    ),
]


def _params(apis: tuple[str, ...], cases: list[tuple[str, dict[str, Any], bytes, str]]) -> list[Any]:
    return [
        pytest.param(api, name, values, wire, id=f"{api}:{name}{suffix}")
        for api in apis
        for name, values, wire, suffix in cases
    ]


GOLDEN = (
    _params(DRA_PLUGIN_APIS, DRA_PLUGIN_CASES)
    + _params(("dra/v1",), DRA_V1_ONLY_CASES)
    + _params(DRA_HEALTH_APIS, DRA_HEALTH_CASES)
)

# Parse-only cases: bytes a conforming reader must accept although our serializer never writes
# them. Each case: API, message, expected values, accepted bytes, canonical bytes.
ACCEPTED_NON_CANONICAL = [
    pytest.param(
        api,
        "NodeUnprepareResourcesResponse",
        {"claims": {"uid-1": {}}},
        b"\x0a\x07\x0a\x05uid-1",  # entry without its value field (2): the value is the empty message
        b"\x0a\x09\x0a\x05uid-1\x12\x00",  # what we write: the value, empty, is still written
        id=f"{api}:NodeUnprepareResourcesResponse-entry-without-value",
    )
    for api in DRA_PLUGIN_APIS
] + [
    pytest.param(
        api,
        "NodePrepareResourcesResponse",
        {"claims": {"u1": {"error": "b"}}},
        b"\x0a\x09\x12\x03\x12\x01a\x0a\x02u1"  # entry, len 5 + 4 = 9: value {error "a"} before key "u1"
        b"\x0a\x09\x0a\x02u1\x12\x03\x12\x01b",  # a later entry for the same key replaces the earlier one
        b"\x0a\x09\x0a\x02u1\x12\x03\x12\x01b",  # canonical: one entry, key first, len 4 + 5 = 9
        id=f"{api}:NodePrepareResourcesResponse-entry-order-and-last-key-wins",
    )
    for api in DRA_PLUGIN_APIS
]

VARINT_LITERALS = [
    pytest.param(30, b"\x1e", id="30"),
    pytest.param(1700000000, b"\x80\xe2\xcf\xaa\x06", id="1700000000"),
    pytest.param(-1, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", id="-1"),
]

TAG_LITERALS = [
    pytest.param(1, 2, b"\x0a", id="field1-len"),
    pytest.param(2, 0, b"\x10", id="field2-varint"),
    pytest.param(2, 2, b"\x12", id="field2-len"),
    pytest.param(3, 0, b"\x18", id="field3-varint"),
    pytest.param(3, 2, b"\x1a", id="field3-len"),
    pytest.param(4, 0, b"\x20", id="field4-varint"),
    pytest.param(4, 2, b"\x22", id="field4-len"),
    pytest.param(5, 2, b"\x2a", id="field5-len"),
]


def _message(api: str, name: str, values: dict[str, Any]) -> Message:
    """Build the generated message from plain values, inside the test, not at import."""
    module = MODULES[api]
    assert name in module.DESCRIPTOR.message_types_by_name, f"{api} {name} is not in the generated code"
    message: Message = getattr(module, name)(**values)
    assert message.DESCRIPTOR.full_name == f"{UPSTREAM[api].package}.{name}", "another wire name"
    return message


def _submessages(fd: FieldDescriptor, value: Any) -> list[Message]:
    """The submessages a set field holds, map values included."""
    if fd.message_type is None:
        return []
    if fd.message_type.GetOptions().map_entry:
        map_value = fd.message_type.fields_by_name["value"]
        return list(value.values()) if map_value.message_type is not None else []
    return list(value) if fd.is_repeated else [value]


def _text(message: Message) -> str:
    return text_format.MessageToString(message, as_one_line=True) or "<empty>"


def _unknown_fields(message: Message, path: str = "") -> list[str]:
    """Field numbers the generated class did not recognise, anywhere in the tree."""
    path = path or message.DESCRIPTOR.name
    fields = UnknownFieldSet(message)
    found = [f"{path}: unknown field {fields[i].field_number}" for i in range(len(fields))]
    for fd, value in message.ListFields():
        for i, child in enumerate(_submessages(fd, value)):
            found += _unknown_fields(child, f"{path}.{fd.name}[{i}]")
    return found


def _set_fields(message: Message, seen: set[str]) -> None:
    """Record the full name of every field holding a non-default value, recursing into submessages."""
    for fd, value in message.ListFields():
        seen.add(fd.full_name)
        for child in _submessages(fd, value):
            _set_fields(child, seen)


def _independent_varint(value: int) -> bytes:
    """Base-128 varint of value as a 64-bit two's complement integer."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@pytest.mark.parametrize(("api", "name", "values", "wire"), GOLDEN)
def test_hand_written_bytes_parse_to_the_expected_values(
    api: str, name: str, values: dict[str, Any], wire: bytes
) -> None:
    """Guards what we read from the kubelet: its bytes land in the right fields with the right values."""
    expected = _message(api, name, values)
    parsed = type(expected).FromString(wire)
    assert _unknown_fields(parsed) == [], "bytes went to field numbers our descriptor does not declare"
    assert parsed == expected, f"parsed {_text(parsed)!r}, expected {_text(expected)!r}"


@pytest.mark.parametrize(("api", "name", "values", "wire"), GOLDEN)
def test_expected_values_serialize_to_exactly_the_hand_written_bytes(
    api: str, name: str, values: dict[str, Any], wire: bytes
) -> None:
    """Guards what we send to the kubelet: byte-for-byte the upstream encoding (maps sorted by key)."""
    serialized = _message(api, name, values).SerializeToString(deterministic=True)
    assert serialized.hex(" ") == wire.hex(" ")


@pytest.mark.parametrize(("api", "name", "values", "accepted", "canonical"), ACCEPTED_NON_CANONICAL)
def test_parser_accepts_non_canonical_map_entries(
    api: str, name: str, values: dict[str, Any], accepted: bytes, canonical: bytes
) -> None:
    """Guards interop with senders that omit a default map value or order an entry's fields otherwise."""
    expected = _message(api, name, values)
    parsed = type(expected).FromString(accepted)
    assert parsed == expected, f"parsed {_text(parsed)!r}, expected {_text(expected)!r}"
    assert parsed.SerializeToString(deterministic=True).hex(" ") == canonical.hex(" ")


def test_share_id_presence_is_kept_apart_from_its_value() -> None:
    """Guards explicit presence (v1 Device.share_id): "" set is not "unset", in both directions."""
    unset = dra_v1.Device.FromString(b"\x1a\x01d")
    set_empty = dra_v1.Device.FromString(b"\x1a\x01d\x2a\x00")  # share_id: field 5, LEN 0x2a, len 0
    assert (unset.HasField("share_id"), set_empty.HasField("share_id")) == (False, True)
    assert (unset.share_id, set_empty.share_id) == ("", "")
    assert unset != set_empty


def test_v1beta1_device_has_no_field_5_so_a_share_id_stays_unknown() -> None:
    """Guards the one wire difference between DRAPlugin v1beta1 and v1: v1beta1 reads field 5 as unknown."""
    wire = b"\x1a\x01d\x2a\x03s-1"  # device_name "d"; share_id (field 5, LEN 0x2a) "s-1"
    parsed = dra_v1beta1.Device.FromString(wire)
    assert [(fd.name, value) for fd, value in parsed.ListFields()] == [("device_name", "d")]
    unknown = UnknownFieldSet(parsed)
    assert [
        (unknown[i].field_number, unknown[i].wire_type, unknown[i].data) for i in range(len(unknown))
    ] == [(5, 2, b"s-1")]


@pytest.mark.parametrize("api", DRA_HEALTH_APIS)
def test_health_status_is_open_so_a_newer_senders_value_survives(api: str) -> None:
    """Guards proto3 open enums: a HealthStatus number we do not know (3) is kept, not dropped."""
    wire = b"\x10\x03"  # health: field 2, VARINT 0x10; 3, not declared upstream today
    parsed = MODULES[api].DeviceHealth.FromString(wire)
    assert parsed.health == 3
    assert parsed.SerializeToString() == wire


@pytest.mark.parametrize("api", DRA_HEALTH_APIS)
def test_health_status_numbers_are_the_upstream_numbers(api: str) -> None:
    """Guards the enum numbers the golden bytes use (UNKNOWN 0, HEALTHY 1, UNHEALTHY 2)."""
    module = MODULES[api]
    assert (module.UNKNOWN, module.HEALTHY, module.UNHEALTHY) == (0, 1, 2)


def test_every_message_of_every_dra_api_has_its_own_golden_case() -> None:
    """Guards completeness: a message added to a DRA proto without a golden case fails here."""
    covered = {(param.values[0], param.values[1]) for param in GOLDEN}
    declared = {
        (api, name) for api, module in MODULES.items() for name in module.DESCRIPTOR.message_types_by_name
    }
    assert sorted(declared - covered) == []


def test_every_field_of_every_dra_message_holds_a_non_default_value_in_some_golden_case() -> None:
    """Guards completeness per field: each field's tag and encoding is exercised at least once."""
    seen: set[str] = set()
    for param in GOLDEN:
        api, name, values, _ = param.values
        assert isinstance(api, str) and isinstance(name, str) and isinstance(values, dict)
        _set_fields(_message(api, name, values), seen)
    declared = {
        fd.full_name
        for module in MODULES.values()
        for descriptor in module.DESCRIPTOR.message_types_by_name.values()
        for fd in descriptor.fields
    }
    assert sorted(declared - seen) == []


def test_the_module_map_covers_exactly_the_dra_apis_of_the_facts() -> None:
    """Guards that every DRA API in upstream_facts has golden bytes here, and no other API."""
    assert set(MODULES) == {api for api in UPSTREAM if api.startswith(("dra/", "dra-health/"))}


def test_golden_case_ids_are_unique() -> None:
    """Guards against a copy-pasted case silently shadowing another in reports."""
    ids = [str(param.id) for param in GOLDEN + ACCEPTED_NON_CANONICAL]
    assert sorted({i for i in ids if ids.count(i) > 1}) == []


@pytest.mark.parametrize(("value", "literal"), VARINT_LITERALS)
def test_varint_literals_match_an_independent_encoder(value: int, literal: bytes) -> None:
    """Guards the hand arithmetic behind the integer literals above (cross-check only)."""
    assert _independent_varint(value).hex(" ") == literal.hex(" ")


@pytest.mark.parametrize(("field_number", "wire_type", "literal"), TAG_LITERALS)
def test_tag_literals_are_field_number_shifted_by_three_or_wire_type(
    field_number: int, wire_type: int, literal: bytes
) -> None:
    """Guards the hand arithmetic behind every tag byte above: (field_number << 3) | wire_type."""
    assert _independent_varint((field_number << 3) | wire_type) == literal

"""The generated descriptors must state exactly the upstream kubelet APIs.

Everything the kubelet sees on the wire comes from these descriptors: the gRPC method
path (/<package>.<Service>/<Rpc>), the message types, field numbers, wire types and
streaming. Each test compares one aspect of api_pb2.DESCRIPTOR with the hand-written
table in tests/wire/upstream_facts.py in both directions: nothing upstream may be
missing from ours, and ours may declare nothing upstream does not.
"""

from __future__ import annotations

from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
    MethodDescriptor,
)

from shim.generated.dra.v1 import api_pb2 as dra_v1_pb2
from shim.generated.dra.v1beta1 import api_pb2 as dra_v1beta1_pb2
from shim.generated.drahealth.v1 import api_pb2 as drahealth_v1_pb2
from shim.generated.drahealth.v1alpha1 import api_pb2 as drahealth_v1alpha1_pb2
from shim.generated.pluginregistration.v1 import api_pb2 as pluginregistration_pb2
from shim.generated.podresources.v1 import api_pb2 as podresources_pb2
from shim.generated.v1beta1 import api_pb2 as deviceplugin_pb2

from .upstream_facts import UPSTREAM, EnumValue, Field, Proto, Rpc

# Which generated module claims to implement which upstream API (our layout, not an upstream fact).
GENERATED: dict[str, ModuleType] = {
    "deviceplugin/v1beta1": deviceplugin_pb2,
    "pluginregistration/v1": pluginregistration_pb2,
    "podresources/v1": podresources_pb2,
    "dra/v1beta1": dra_v1beta1_pb2,
    "dra/v1": dra_v1_pb2,
    "dra-health/v1alpha1": drahealth_v1alpha1_pb2,
    "dra-health/v1": drahealth_v1_pb2,
}

SCALAR_TYPE_NAMES = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_SINT32: "sint32",
    FieldDescriptor.TYPE_SINT64: "sint64",
    FieldDescriptor.TYPE_FIXED32: "fixed32",
    FieldDescriptor.TYPE_FIXED64: "fixed64",
    FieldDescriptor.TYPE_SFIXED32: "sfixed32",
    FieldDescriptor.TYPE_SFIXED64: "sfixed64",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_ENUM: "enum",
    FieldDescriptor.TYPE_GROUP: "group",
}

APIS = pytest.mark.parametrize("api", sorted(UPSTREAM), ids=str)


def _file(api: str) -> FileDescriptor:
    file: FileDescriptor = GENERATED[api].DESCRIPTOR
    return file


def _file_proto(api: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    _file(api).CopyToProto(proto)
    return proto


def _map_value_type(entry: Descriptor, package: str) -> str:
    """map<K,V>: V is a scalar type's name, or a message's name as upstream writes it."""
    key, value = entry.fields_by_number.get(1), entry.fields_by_number.get(2)
    if key is None or value is None or len(entry.fields) != 2:
        return "map<malformed>"
    value_name = _type_name(value, package)
    if value_name == "message":
        value_name = _short(_submessage(value).full_name, package)
    return f"map<{_type_name(key, package)},{value_name}>"


def _submessage(fd: FieldDescriptor) -> Descriptor:
    assert fd.message_type is not None, f"{fd.full_name} is a message field without a message type"
    return fd.message_type


def _enum(fd: FieldDescriptor) -> EnumDescriptor:
    assert fd.enum_type is not None, f"{fd.full_name} is an enum field without an enum type"
    return fd.enum_type


def _type_name(fd: FieldDescriptor, package: str) -> str:
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        if _submessage(fd).GetOptions().map_entry:
            return _map_value_type(_submessage(fd), package)
        return "message"
    return SCALAR_TYPE_NAMES[fd.type]


def _label(fd: FieldDescriptor) -> str:
    if fd.is_repeated:
        return "repeated"
    return "required" if fd.is_required else "optional"


def _proto3_optional(fd: FieldDescriptor) -> bool:
    """Whether the field was declared with proto3's `optional` keyword, as its descriptor proto says."""
    assert fd.containing_type is not None, f"{fd.full_name} belongs to no message"
    message = descriptor_pb2.DescriptorProto()
    fd.containing_type.CopyToProto(message)
    (declared,) = [f for f in message.field if f.number == fd.number]
    return declared.proto3_optional


def _as_fact(fd: FieldDescriptor, package: str) -> Field:
    """Restate one generated field in the vocabulary of upstream_facts.Field."""
    type_name = _type_name(fd, package)
    message = _short(_submessage(fd).full_name, package) if type_name == "message" else None
    enum = _short(_enum(fd).full_name, package) if type_name == "enum" else None
    return Field(fd.name, fd.number, type_name, _label(fd), message, enum, _proto3_optional(fd))


def _short(full_name: str, package: str) -> str:
    """Name a message of `package` the way upstream writes it; leave foreign messages fully qualified."""
    return full_name.removeprefix(f"{package}.") if full_name.startswith(f"{package}.") else full_name


def _as_rpc(method: MethodDescriptor, package: str) -> Rpc:
    """Restate one generated method in the vocabulary of upstream_facts.Rpc."""
    return Rpc(
        method.name,
        _short(method.input_type.full_name, package),
        _short(method.output_type.full_name, package),
        method.server_streaming,
    )


def _missing_and_extra(upstream: set[str], ours: set[str], what: str) -> list[str]:
    problems = [f"missing {what} (upstream has it, we do not): {name}" for name in sorted(upstream - ours)]
    problems += [f"extra {what} (we have it, upstream does not): {name}" for name in sorted(ours - upstream)]
    return problems


def _all_messages(api: str) -> list[Descriptor]:
    """Every message of the file, nested ones (map entries) included."""
    found: list[Descriptor] = []
    pending = list(_file(api).message_types_by_name.values())
    while pending:
        message = pending.pop()
        found.append(message)
        pending.extend(message.nested_types)
    return found


@APIS
def test_package_name_is_the_upstream_package(api: str) -> None:
    """Guards the first segment of every gRPC method path and every message type URL."""
    facts: Proto = UPSTREAM[api]
    assert _file(api).package == facts.package


@APIS
def test_services_have_the_upstream_wire_names(api: str) -> None:
    """Guards the gRPC path prefix the kubelet dials (/<name>/<Rpc>), stated apart from the package."""
    services = _file(api).services_by_name
    problems = [
        f"{name}: upstream {wire_name!r}, ours {services[name].full_name!r}"
        for name, wire_name in UPSTREAM[api].wire_service_names.items()
        if name in services and services[name].full_name != wire_name
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("api", sorted(a for a, facts in UPSTREAM.items() if facts.go_package), ids=str)
def test_go_package_option_is_the_upstream_one_where_stated(api: str) -> None:
    """Guards go_package (not on the wire, but a fact of the file) where the table states it."""
    assert _file_proto(api).options.go_package == UPSTREAM[api].go_package


@APIS
def test_file_is_proto3_like_upstream(api: str) -> None:
    """Guards proto3 semantics (implicit presence, packed repeated scalars) that upstream relies on."""
    assert _file_proto(api).syntax == UPSTREAM[api].syntax


@APIS
def test_file_imports_nothing_because_upstream_imports_nothing(api: str) -> None:
    """Guards against types borrowed from another file (e.g. gogoproto or well-known types)."""
    assert [dep.name for dep in _file(api).dependencies] == []


@APIS
def test_services_are_exactly_the_upstream_services(api: str) -> None:
    """Guards that no upstream service is missing and no service upstream lacks is declared."""
    problems = _missing_and_extra(set(UPSTREAM[api].services), set(_file(api).services_by_name), "service")
    assert not problems, "\n".join(problems)


@APIS
def test_every_service_has_exactly_the_upstream_rpcs(api: str) -> None:
    """Guards that each service offers every upstream rpc and no rpc upstream lacks."""
    problems: list[str] = []
    for service_name, rpcs in UPSTREAM[api].services.items():
        service = _file(api).services_by_name.get(service_name)
        if service is None:
            continue  # reported by the services test
        problems += _missing_and_extra(
            {rpc.name for rpc in rpcs}, set(service.methods_by_name), f"rpc of {service_name}"
        )
    assert not problems, "\n".join(problems)


@APIS
def test_every_rpc_has_the_upstream_input_output_and_streaming(api: str) -> None:
    """Guards request/response types and the server-streaming flag of each rpc (e.g. ListAndWatch)."""
    facts = UPSTREAM[api]
    problems: list[str] = []
    for service_name, rpcs in facts.services.items():
        service = _file(api).services_by_name.get(service_name)
        if service is None:
            continue
        for expected in rpcs:
            method = service.methods_by_name.get(expected.name)
            if method is None:
                continue
            actual = _as_rpc(method, facts.package)
            if actual != expected:
                problems.append(f"{service_name}.{expected.name}: upstream {expected}, ours {actual}")
    assert not problems, "\n".join(problems)


@APIS
def test_no_rpc_is_client_streaming_because_upstream_has_none(api: str) -> None:
    """Guards against a client-streaming rpc, which upstream never declares."""
    streaming = [
        method.full_name
        for service in _file(api).services_by_name.values()
        for method in service.methods
        if method.client_streaming
    ]
    assert streaming == []


@APIS
def test_messages_are_exactly_the_upstream_messages(api: str) -> None:
    """Guards that every upstream top-level message exists and no extra one is declared."""
    problems = _missing_and_extra(
        set(UPSTREAM[api].messages), set(_file(api).message_types_by_name), "message"
    )
    assert not problems, "\n".join(problems)


@APIS
def test_every_message_has_exactly_the_upstream_field_names(api: str) -> None:
    """Guards that no upstream field is missing from a message and no extra field is declared."""
    problems: list[str] = []
    for message_name, fields in UPSTREAM[api].messages.items():
        message = _file(api).message_types_by_name.get(message_name)
        if message is None:
            continue  # reported by the messages test
        problems += _missing_and_extra(
            {f.name for f in fields}, set(message.fields_by_name), f"field of {message_name}"
        )
    assert not problems, "\n".join(problems)


@APIS
def test_every_field_has_the_upstream_number_type_label_and_message_type(api: str) -> None:
    """Guards the wire identity of each field: its number, wire-level type, repeatedness and submessage."""
    facts = UPSTREAM[api]
    problems: list[str] = []
    for message_name, fields in facts.messages.items():
        message = _file(api).message_types_by_name.get(message_name)
        if message is None:
            continue
        for expected in fields:
            fd = message.fields_by_name.get(expected.name)
            if fd is None:
                continue
            actual = _as_fact(fd, facts.package)
            if actual != expected:
                problems.append(f"{message_name}.{expected.name}: upstream {expected}, ours {actual}")
    assert not problems, "\n".join(problems)


@APIS
def test_field_numbers_are_exactly_the_upstream_numbers(api: str) -> None:
    """Guards the number set per message both ways, so a renamed-and-renumbered field cannot hide."""
    problems: list[str] = []
    for message_name, fields in UPSTREAM[api].messages.items():
        message = _file(api).message_types_by_name.get(message_name)
        if message is None:
            continue
        problems += _missing_and_extra(
            {str(f.number) for f in fields},
            {str(n) for n in message.fields_by_number},
            f"field number of {message_name}",
        )
    assert not problems, "\n".join(problems)


@APIS
def test_removed_upstream_field_numbers_are_not_declared(api: str) -> None:
    """Guards tombstones: e.g. podresources DynamicResource field 1 (class_name) must not come back."""
    problems: list[str] = []
    for message_name, removed in UPSTREAM[api].removed_fields.items():
        message = _file(api).message_types_by_name[message_name]
        for number, old_name in removed.items():
            if number in message.fields_by_number:
                problems.append(f"{message_name} declares removed field number {number}")
            if old_name in message.fields_by_name:
                problems.append(f"{message_name} declares removed field {old_name!r}")
    assert not problems, "\n".join(problems)


def test_dynamic_resource_has_no_field_1() -> None:
    """Guards the one tombstone upstream has today, stated directly in case the table loses it."""
    message = podresources_pb2.DESCRIPTOR.message_types_by_name["DynamicResource"]
    assert 1 not in message.fields_by_number, f"field 1 is declared as {message.fields_by_number[1].name!r}"
    assert "class_name" not in message.fields_by_name


@APIS
def test_map_fields_are_entries_with_map_entry_option(api: str) -> None:
    """Guards maps (envs, annotations: map<string,string>; DRA's claims: map<string,Message>):
    a repeated XxxEntry nested in the message, with key=1 and value=2 of the upstream types."""
    package = UPSTREAM[api].package
    problems: list[str] = []
    for message_name, fields in UPSTREAM[api].messages.items():
        for expected in fields:
            if not expected.type.startswith("map<"):
                continue
            key_type, value_type = expected.type.removeprefix("map<").removesuffix(">").split(",")
            fd = _file(api).message_types_by_name[message_name].fields_by_name[expected.name]
            entry = _submessage(fd)
            key, value = entry.fields_by_number[1], entry.fields_by_number[2]
            value_message = value.message_type.full_name if value.message_type is not None else None
            observed = (
                fd.is_repeated,
                fd.type == FieldDescriptor.TYPE_MESSAGE,
                entry.GetOptions().map_entry,
                (key.name, SCALAR_TYPE_NAMES[key.type]),
                (value.name, SCALAR_TYPE_NAMES.get(value.type, "message"), value_message),
                entry.containing_type is not None and entry.containing_type.full_name,
            )
            scalar_value = value_type in SCALAR_TYPE_NAMES.values()
            wanted = (
                True,
                True,
                True,
                ("key", key_type),
                (
                    "value",
                    value_type if scalar_value else "message",
                    None if scalar_value else f"{package}.{value_type}",
                ),
                f"{package}.{message_name}",
            )
            if observed != wanted:
                problems.append(f"{message_name}.{expected.name}: {observed} != {wanted}")
    assert not problems, "\n".join(problems)


@APIS
def test_enums_are_exactly_the_upstream_enums(api: str) -> None:
    """Guards the file-level enums (DRA health's HealthStatus): none missing, none extra."""
    problems = _missing_and_extra(set(UPSTREAM[api].enums), set(_file(api).enum_types_by_name), "enum")
    assert not problems, "\n".join(problems)


@APIS
def test_every_enum_has_exactly_the_upstream_values(api: str) -> None:
    """Guards each enum value's name and number both ways (the number is what goes on the wire)."""
    problems: list[str] = []
    for enum_name, values in UPSTREAM[api].enums.items():
        enum = _file(api).enum_types_by_name.get(enum_name)
        if enum is None:
            continue  # reported by the enums test
        ours = {str(EnumValue(v.name, v.number)) for v in enum.values}
        problems += _missing_and_extra({str(v) for v in values}, ours, f"value of {enum_name}")
        if enum.is_closed:
            problems.append(f"{enum_name} is closed; upstream's proto3 enum is open")
    assert not problems, "\n".join(problems)


@APIS
def test_only_map_entries_are_nested_and_no_nested_enums_or_extensions_exist(api: str) -> None:
    """Guards against nested messages, nested enums or extensions that upstream does not declare
    (file-level enums are checked against the table by the enum tests)."""
    problems: list[str] = []
    file = _file(api)
    if file.extensions_by_name:
        problems.append(f"file-level extensions: {sorted(file.extensions_by_name)}")
    for message in _all_messages(api):
        for nested in message.nested_types:
            if not nested.GetOptions().map_entry:
                problems.append(f"nested message {nested.full_name}")
        if message.enum_types:
            problems.append(f"enums in {message.full_name}")
        if message.extensions:
            problems.append(f"extensions in {message.full_name}")
    assert not problems, "\n".join(problems)


@APIS
def test_no_real_oneof_and_explicit_presence_exactly_where_upstream_writes_optional(api: str) -> None:
    """Guards proto3 implicit presence on every singular scalar but those upstream declares
    `optional` (DRA v1 Device.share_id), each of which has only its synthetic oneof `_<name>`."""
    facts = UPSTREAM[api]
    problems: list[str] = []
    for message in _all_messages(api):
        if message.GetOptions().map_entry:
            continue
        declared = {f.name: f for f in facts.messages.get(message.name, ())}
        optional = {name for name, f in declared.items() if f.proto3_optional}
        want_oneofs = {f"_{name}": [name] for name in optional}
        oneofs = {o.name: [f.name for f in o.fields] for o in message.oneofs}
        if oneofs != want_oneofs:
            problems.append(f"{message.full_name} has oneofs {oneofs}, upstream only {want_oneofs}")
        for fd in message.fields:
            if fd.type == FieldDescriptor.TYPE_MESSAGE or fd.is_repeated:
                continue
            if fd.has_presence != (fd.name in optional):
                problems.append(
                    f"{fd.full_name}: explicit presence {fd.has_presence}, upstream {fd.name in optional}"
                )
    assert not problems, "\n".join(problems)


@APIS
def test_repeated_numeric_fields_are_packed_like_proto3_default(api: str) -> None:
    """Guards packed encoding of repeated scalars (podresources cpu_ids): upstream sets no [packed=false]."""
    unpacked = [
        fd.full_name
        for message in _all_messages(api)
        for fd in message.fields
        if fd.is_repeated
        and fd.type
        not in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_MESSAGE)
        and not fd.is_packed
    ]
    assert unpacked == []


@APIS
def test_no_reserved_ranges_or_names_because_upstream_declares_none(api: str) -> None:
    """Guards that we declare no reservation upstream lacks (its tombstones are comments only)."""
    problems = [
        f"{message.name}: reserved {list(message.reserved_range)} {list(message.reserved_name)}"
        for message in _file_proto(api).message_type
        if message.reserved_range or message.reserved_name
    ]
    assert not problems, "\n".join(problems)


def test_every_upstream_api_has_a_generated_module() -> None:
    """Guards the table and the module map against drifting apart (a new API added to only one)."""
    assert set(GENERATED) == set(UPSTREAM)


def test_upstream_table_is_self_consistent() -> None:
    """Guards the hand-written table itself: unique names/numbers, and every referenced message exists."""
    problems: list[str] = []
    for api, facts in UPSTREAM.items():
        if (facts.upstream_commit is None) == (facts.upstream_release is None):
            problems.append(f"{api}: read at a commit or at a release, exactly one")
        if set(facts.wire_service_names) - set(facts.services):
            problems.append(f"{api}: wire name of an unknown service")
        if set(facts.registration_names) - set(facts.services):
            problems.append(f"{api}: registration name of an unknown service")
        for name in facts.added_in:
            message_name, _, field_name = name.partition(".")
            if field_name not in {f.name for f in facts.messages.get(message_name, ())}:
                problems.append(f"{api}: added_in names unknown field {name}")
        for enum_name, values in facts.enums.items():
            if len({v.name for v in values}) != len(values) or len({v.number for v in values}) != len(values):
                problems.append(f"{api} {enum_name}: duplicate value name or number")
            if 0 not in {v.number for v in values}:
                problems.append(f"{api} {enum_name}: a proto3 enum's first value is 0")
        for message_name, fields in facts.messages.items():
            if len({f.name for f in fields}) != len(fields) or len({f.number for f in fields}) != len(fields):
                problems.append(f"{api} {message_name}: duplicate field name or number")
            for f in fields:
                if (f.type == "message") != (f.message is not None):
                    problems.append(f"{api} {message_name}.{f.name}: message type iff type 'message'")
                if f.message is not None and f.message not in facts.messages:
                    problems.append(f"{api} {message_name}.{f.name}: unknown message {f.message}")
                if (f.type == "enum") != (f.enum is not None):
                    problems.append(f"{api} {message_name}.{f.name}: enum type iff type 'enum'")
                if f.enum is not None and f.enum not in facts.enums:
                    problems.append(f"{api} {message_name}.{f.name}: unknown enum {f.enum}")
                if f.proto3_optional and (f.label != "optional" or f.type in ("message", "enum")):
                    problems.append(
                        f"{api} {message_name}.{f.name}: `optional` only on singular scalars here"
                    )
                if f.type.startswith("map<"):
                    if f.label != "repeated":
                        problems.append(f"{api} {message_name}.{f.name}: a map is repeated")
                    value = f.type.removesuffix(">").split(",")[-1]
                    if value not in SCALAR_TYPE_NAMES.values() and value not in facts.messages:
                        problems.append(f"{api} {message_name}.{f.name}: unknown map value {value}")
            for number in facts.removed_fields.get(message_name, {}):
                if number in {f.number for f in fields}:
                    problems.append(f"{api} {message_name}: removed number {number} is also a field")
        for service_name, rpcs in facts.services.items():
            for rpc in rpcs:
                for type_name in (rpc.input, rpc.output):
                    if type_name not in facts.messages:
                        problems.append(f"{api} {service_name}.{rpc.name}: unknown message {type_name}")
    assert not problems, "\n".join(problems)

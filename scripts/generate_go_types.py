"""Generate the Go SDK's message types (sdk/go/types_gen.go) from proto/driver/v1/driver.proto.

Usage: python scripts/generate_go_types.py [--out FILE]

The schema stays single-sourced: protoc (grpcio-tools' bundled one) reads the proto with its
comments, and this script writes one Go struct per message, one typed constant set per enum and
the method names of the two services, with a strict proto3-JSON reader per message (both field
name forms, null as the default, unknown fields and wrong types refused) built on the hand-written
helpers of sdk/go/protojson.go. Writing needs no code per message: encoding/json follows the
struct tags (proto names, defaults omitted, int64 as a string, enums by name). A field added to
the schema becomes a field here at the next run; tests/conformance/test_go_sdk.py fails while the
committed file differs from what this writes.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = Path("driver/v1/driver.proto")
OUT = ROOT / "sdk" / "go" / "types_gen.go"
PACKAGE = "driver"

F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    F.TYPE_STRING: ("string", "String"),
    F.TYPE_BOOL: ("bool", "Bool"),
    F.TYPE_INT32: ("int32", "Int32"),
    F.TYPE_INT64: ("int64", "Int64"),
}
# Go's initialisms (Effective Go, "MixedCaps"; the Go wiki's CodeReviewComments "Initialisms").
INITIALISMS = {"id": "ID", "ids": "IDs", "cdi": "CDI", "numa": "NUMA", "rpc": "RPC", "uid": "UID"}
# Enum values outside their enum's own prefix (HEALTHY, DEBUG) take a prefix that reads well.
VALUE_PREFIX = {"Health": "", "LogLevel": "Log"}


def go_name(snake_or_camel: str) -> str:
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", snake_or_camel).lower().split("_")
    return "".join(INITIALISMS.get(w, w[:1].upper() + w[1:]) for w in words if w)


def descriptor(proto_dir: Path) -> descriptor_pb2.FileDescriptorProto:
    with tempfile.TemporaryDirectory() as out:
        target = Path(out) / "driver.pb"
        args = ["grpc_tools.protoc", f"-I{proto_dir}", "--include_source_info"]
        if protoc.main([*args, f"--descriptor_set_out={target}", str(PROTO)]) != 0:
            raise SystemExit("protoc failed")
        files = descriptor_pb2.FileDescriptorSet.FromString(target.read_bytes())
    (found,) = files.file
    return found


class Comments:
    """The proto's comments by descriptor path (message 4, its field 2; enum 5; service 6)."""

    def __init__(self, file: descriptor_pb2.FileDescriptorProto) -> None:
        self._by_path = {
            tuple(loc.path): loc.leading_comments.strip() for loc in file.source_code_info.location
        }

    def lines(self, path: tuple[int, ...], indent: str = "") -> list[str]:
        text = self._by_path.get(path, "")
        return [f"{indent}// {line.strip()}".rstrip() for line in text.splitlines()] if text else []


def go_type(field: F, messages: dict[str, descriptor_pb2.DescriptorProto]) -> str:
    if field.type == F.TYPE_MESSAGE:
        entry = messages[field.type_name]
        if entry.options.map_entry:
            key, value = entry.field
            held = go_type(value, messages).removeprefix("*")  # a map holds message values
            return f"map[{go_type(key, messages)}]{held}"
        name = go_name(field.type_name.rsplit(".", 1)[1])
        return f"[]{name}" if field.label == F.LABEL_REPEATED else f"*{name}"
    base = go_name(field.type_name.rsplit(".", 1)[1]) if field.type == F.TYPE_ENUM else SCALARS[field.type][0]
    if field.label == F.LABEL_REPEATED:
        return f"[]{base}"
    return f"*{base}" if field.HasField("oneof_index") else base


def reader(field: F, messages: dict[str, descriptor_pb2.DescriptorProto]) -> str:
    """The protojson.go call that reads ``raw`` into ``&m.<Field>``."""
    target = f"&m.{go_name(field.name)}"
    if field.type == F.TYPE_MESSAGE:
        entry = messages[field.type_name]
        if entry.options.map_entry:
            value = entry.field[1]
            if value.type == F.TYPE_MESSAGE:
                return f"readMessageMap[{go_name(value.type_name.rsplit('.', 1)[1])}](raw, {target})"
            return f"readMap(raw, {target}, read{SCALARS[value.type][1]})"
        message = go_name(field.type_name.rsplit(".", 1)[1])
        if field.label == F.LABEL_REPEATED:
            return f"readMessages[{message}](raw, {target})"
        return f"readMessage[{message}](raw, {target})"
    if field.type == F.TYPE_ENUM:
        enum = go_name(field.type_name.rsplit(".", 1)[1])
        one = f"read{enum}"
    else:
        one = f"read{SCALARS[field.type][1]}"
    if field.label == F.LABEL_REPEATED:
        return f"readList(raw, {target}, {one})"
    if field.HasField("oneof_index"):
        return f"readOptional(raw, {target}, {one})"
    return f"{one}(raw, {target})"


def struct(
    index: int, message: descriptor_pb2.DescriptorProto, messages: dict[str, descriptor_pb2.DescriptorProto],
    comments: Comments,
) -> list[str]:  # fmt: skip
    name = go_name(message.name)
    doc = comments.lines((4, index))
    out = [f"// {name} is the schema's message {message.name}." + (" " if doc else "")]
    if doc:
        out[0] = out[0].rstrip()
        out += ["//", *doc]
    oneofs = [o.name for o in message.oneof_decl]
    real = {i for i, o in enumerate(oneofs) if not o.startswith("_")}  # "_grant": proto3 optional
    if real:
        names = " and ".join(oneofs[i] for i in real)
        out += ["//", f"// Its pointer fields form the schema's oneof {names}: set exactly one."]
    out.append(f"type {name} struct {{")
    for number, field in enumerate(message.field):
        out += comments.lines((4, index, 2, number), "\t")
        tags = [field.name, "omitempty"]
        if field.type == F.TYPE_INT64 and field.label != F.LABEL_REPEATED:
            tags.append("string")  # proto3 JSON writes a 64-bit integer as a string
        out.append(f'\t{go_name(field.name)} {go_type(field, messages)} `json:"{",".join(tags)}"`')
    out.append("}")
    out += [
        "",
        f"// UnmarshalJSON reads {article(name)} {name} in the proto3 JSON mapping: proto or lowerCamelCase",
        "// names, null as the default; an unknown field or a value of the wrong type is an error.",
        f"func (m *{name}) UnmarshalJSON(data []byte) error {{",
        f'\treturn readObject(data, "{message.name}", func(key string, raw []byte) (bool, error) {{',
        "\t\tswitch key {",
    ]
    for field in message.field:
        keys = [f'"{field.name}"'] + ([f'"{field.json_name}"'] if field.json_name != field.name else [])
        out += [f"\t\tcase {', '.join(keys)}:", f"\t\t\treturn true, {reader(field, messages)}"]
    out += ["\t\t}", "\t\treturn false, nil", "\t})", "}"]
    return out


def enum(index: int, value: descriptor_pb2.EnumDescriptorProto, comments: Comments) -> list[str]:
    name = go_name(value.name)
    own = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", value.name).upper() + "_"
    doc = comments.lines((5, index))
    out = [f"// {name} is the schema's enum {value.name}, written by name in JSON."]
    out += ["//", *doc] if doc else []
    out += [f"type {name} int32", "", "// The values of " + name + ".", "const ("]
    for number, item in enumerate(value.value):
        rest = item.name.removeprefix(own)
        const = name + go_name(rest) if rest != item.name else VALUE_PREFIX.get(name, name) + go_name(rest)
        out += comments.lines((5, index, 2, number), "\t")
        out.append(f"\t{const} {name} = {item.number}")
    out += [")", "", f"var {lower(name)}Names = map[{name}]string{{"]
    out += [f'\t{item.number}: "{item.name}",' for item in value.value]
    out += [
        "}",
        "",
        f"// String is the value's name in the schema ({value.value[1].name}), or its number.",
        f"func (v {name}) String() string {{ return enumName(int32(v), {lower(name)}Names[v]) }}",
        "",
        "// MarshalJSON writes the value's name, as proto3 JSON does (a number the schema does",
        "// not name is written as the number).",
        f"func (v {name}) MarshalJSON() ([]byte, error) {{",
        f"\treturn writeEnum(int32(v), {lower(name)}Names[v])",
        "}",
        "",
        "// UnmarshalJSON reads a name or a number.",
        f"func (v *{name}) UnmarshalJSON(data []byte) error {{ return read{name}(data, v) }}",
        "",
        f"func read{name}(raw []byte, v *{name}) error {{",
        f'\treturn readEnum(raw, (*int32)(v), "{value.name}", func(name string) (int32, bool) {{',
        "\t\tswitch name {",
    ]
    out += [f'\t\tcase "{item.name}":\n\t\t\treturn {item.number}, true' for item in value.value]
    out += ["\t\t}", "\t\treturn 0, false", "\t})", "}"]
    return out


def article(name: str) -> str:
    return "an" if name[0] in "AEIOU" else "a"


def lower(name: str) -> str:
    return name[:1].lower() + name[1:]


def methods(file: descriptor_pb2.FileDescriptorProto, comments: Comments) -> list[str]:
    out: list[str] = []
    for index, service in enumerate(file.service):
        kind = {"Driver": "requests devshim sends", "Devshim": "notifications a driver sends"}[service.name]
        out += [f"// The method names of the schema's service {service.name}: the {kind}.", "const ("]
        for number, method in enumerate(service.method):
            out += comments.lines((6, index, 2, number), "\t")
            prefix = "Method" if service.name == "Driver" else "Notify"
            out.append(f'\t{prefix}{go_name(method.name)} = "{method.name}"')
        out += [")", ""]
    return out


def protocol_version(file: descriptor_pb2.FileDescriptorProto, comments: Comments) -> str:
    """The version the schema names in InitializeParams.protocol_version's comment (semver
    ("1.2.0")): the proto is the one source (tests/unit/test_one_truth.py holds
    shim.driverprotocol's constant to that comment)."""
    index = next(i for i, m in enumerate(file.message_type) if m.name == "InitializeParams")
    found = re.search(r'semver \("([^"]+)"\)', "\n".join(comments.lines((4, index, 2, 0))))
    if found is None:
        raise SystemExit("InitializeParams.protocol_version's comment no longer names the version")
    return found.group(1)


def generate(proto_dir: Path = ROOT / "proto") -> str:
    file = descriptor(proto_dir)
    comments = Comments(file)
    messages = {f".{file.package}.{m.name}": m for m in file.message_type}
    for m in file.message_type:
        messages.update({f".{file.package}.{m.name}.{n.name}": n for n in m.nested_type})
    out = [
        "// Code generated by scripts/generate_go_types.py from proto/driver/v1/driver.proto. DO NOT EDIT.",
        "",
        f"package {PACKAGE}",
        "",
        "// ProtocolVersion is the driver protocol version this SDK speaks (semver); devshim and a",
        "// driver talk when their majors are equal.",
        f'const ProtocolVersion = "{protocol_version(file, comments)}"',
        "",
        *methods(file, comments),
    ]
    for index, value in enumerate(file.enum_type):
        out += [*enum(index, value, comments), ""]
    for index, message in enumerate(file.message_type):
        out += [*struct(index, message, messages, comments), ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--proto-dir", type=Path, default=ROOT / "proto", help="where driver/v1/driver.proto is"
    )
    args = parser.parse_args()
    text = generate(args.proto_dir)
    # gofmt aligns the struct tags: the committed file is gofmt's, so go-lint.sh passes it.
    formatted = subprocess.run(["gofmt"], input=text, capture_output=True, text=True, check=False)
    if formatted.returncode != 0:
        sys.exit(f"gofmt refused the generated code:\n{formatted.stderr}")
    args.out.write_text(formatted.stdout)


if __name__ == "__main__":
    main()

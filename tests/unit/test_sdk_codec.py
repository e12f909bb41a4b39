"""The SDK's two readers of incoming params agree: the canonical fast path (every value of exactly
its field's JSON type) and protobuf's proto3 JSON parser, which alone decides anything else.

Params are generated from each params message's descriptor in the canonical form, half of them
with one twist somewhere into another form proto3 JSON allows or forbids (a camelCase key, both
forms at once, a null, a number as a string or float, an out-of-range number, a wrong type, an
unknown key), so a drift of the fast path shows as a disagreement: it accepted what the parser
refuses, or read a value differently.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import given, settings
from hypothesis import strategies as st

from shim.sdk import codec, strict, types
from shim.sdk.errors import InvalidParams
from shim.sdk.generated.protobuf.driver.v1 import driver_pb2

PARAMS = [
    types.InitializeParams,
    types.ListDevicesParams,
    types.AllocateParams,
    types.PreferredAllocationParams,
    types.DevicesParams,
    types.ShutdownParams,
]

EDGES = [0, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32 - 1, 2**32, 2**63, -(2**63) - 1]
ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(EDGES),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.just("12"),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def canonical_value(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_STRING:
        return st.text(max_size=12)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    return st.one_of(st.integers(min_value=-(2**31), max_value=2**31 - 1), st.sampled_from(EDGES[:5]))


def value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    one = params(field.message_type, depth + 1) if field.message_type is not None else canonical_value(field)
    return st.lists(one, max_size=4) if field.is_repeated else one


def params(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Canonical params: snake_case keys, every value of exactly its field's JSON type."""
    if depth > 2:
        return st.just({})
    fields = {f.name: value(f, depth) for f in descriptor.fields}
    return st.fixed_dictionaries({}, optional=fields)


def twist(data: st.DataObject, params: dict[str, Any], descriptor: Descriptor) -> None:
    """One change somewhere in ``params``: a value in another form, a key in its other form or
    repeated in both, or an unknown key."""
    keys = [k for k in params if k in descriptor.fields_by_name]
    how = data.draw(st.sampled_from(["value", "camel", "both", "unknown", "deeper"] if keys else ["unknown"]))
    key = data.draw(st.sampled_from(keys)) if keys else ""
    field = descriptor.fields_by_name.get(key)
    if how == "deeper" and field is not None and field.message_type is not None:
        nested = params[key] if not field.is_repeated else (params[key] or [None])[0]
        if isinstance(nested, dict):
            return twist(data, nested, field.message_type)
    if how in ("value", "deeper") and field is not None:
        if field.is_repeated and params[key] and data.draw(st.booleans()):
            params[key][data.draw(st.integers(0, len(params[key]) - 1))] = data.draw(ODD)
        else:
            params[key] = data.draw(ODD)
    elif how in ("camel", "both") and field is not None:
        params[field.json_name] = params[key] if how == "both" else params.pop(key)
    else:
        params[data.draw(st.sampled_from(["unknown", "Resource", ""]))] = data.draw(ODD)


def by_protobuf(cls: type[Any], params: dict[str, Any]) -> Any:
    try:
        checked = json_format.ParseDict(params, getattr(driver_pb2, cls.__name__)())
    except (json_format.ParseError, TypeError, ValueError):
        return InvalidParams
    return strict.from_checked(cls, checked)


def by_sdk(cls: type[Any], params: dict[str, Any]) -> Any:
    try:
        return codec.decode(cls, "method", params)
    except InvalidParams:
        return InvalidParams


@pytest.mark.parametrize("cls", PARAMS, ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.data())
def test_the_fast_reader_agrees_with_protobufs_parser(cls: type[Any], data: st.DataObject) -> None:
    descriptor = getattr(driver_pb2, cls.__name__).DESCRIPTOR
    generated = data.draw(params(descriptor))
    if data.draw(st.booleans()):
        twist(data, generated, descriptor)
    assert by_sdk(cls, generated) == by_protobuf(cls, generated)


def test_devshims_own_params_take_the_fast_path() -> None:
    preference = {
        "resource": "example.com/gpu",
        "containers": [{"available": [f"gpu{i}" for i in range(64)], "must_include": ["gpu3"], "size": 8}],
    }
    read = codec.read_canonical(types.PreferredAllocationParams, preference)
    assert read == by_protobuf(types.PreferredAllocationParams, preference)
    assert read is not None and read.containers[0].size == 8
    # A form only the parser knows (a number as a string) leaves the decision to it.
    preference["containers"][0]["size"] = "8"  # type: ignore[index]
    assert codec.read_canonical(types.PreferredAllocationParams, preference) is None
    assert by_sdk(types.PreferredAllocationParams, preference) == read


def test_a_driver_importing_the_sdk_loads_neither_grpc_pydantic_nor_protobuf() -> None:
    """What a driver pays (issue 31): the SDK is the JSON-RPC peer and its messages, not
    devshim's gRPC side; betterproto2 is kept from loading pydantic, which it would whenever
    pydantic is installed (a driver may still use pydantic itself); and protobuf's runtime waits
    for params that are not in devshim's canonical form."""
    probe = (
        "import sys, shim.sdk\n"
        "from shim.sdk import codec, types\n"
        "params = {'resource': 'r', 'containers': [{'device_ids': ['a']}]}\n"
        "codec.decode(types.AllocateParams, 'allocate', params)\n"
        "heavy = ('grpc', 'pydantic', 'pydantic_core', 'google.protobuf')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "import pydantic\n"
        "class M(pydantic.BaseModel):\n    x: int\n"
        "print(M(x=1).x, shim.sdk.types.Health.HEALTHY.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "1 HEALTHY"], done.stdout

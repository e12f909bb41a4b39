"""ListAndWatch messages encoded once per device, and served as bytes.

A health change among 10,000 devices used to rebuild and re-serialize all 10,000 Device
messages (about 100 ms in Python). A ListAndWatchResponse is nothing but its repeated
``devices`` field, whose encoding is the concatenation of one length-delimited record per
device, so each device's record is kept until that device changes, and a new list is a join
of records. The bytes reach the wire through a handler table whose serializer passes bytes
through (``handlers``): the generated ``add_DevicePluginServicer_to_server`` would insist on a
message object. tests/unit/test_list_cache.py checks the bytes equal protobuf's own encoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import grpc

from shim.model import Device


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class ListEncoder:
    """One stream's ListAndWatchResponse bytes, re-encoding only devices not seen in the last list."""

    def __init__(self, pb: ModuleType, encode_device: Callable[[ModuleType, Device], Any]) -> None:
        self._pb = pb
        self._encode_device = encode_device
        field = pb.ListAndWatchResponse.DESCRIPTOR.fields_by_name["devices"]
        self._tag = _varint(field.number << 3 | 2)  # wire type 2: length-delimited
        # By identity (sources keep the Device objects that did not change; hashing 10,000 frozen
        # dataclasses would cost more than the rest), then by value. Each entry holds its device,
        # so an id is never reused while cached.
        self._by_id: dict[int, tuple[Device, bytes]] = {}
        self._by_value: dict[Device, bytes] = {}

    def encode(self, devices: Sequence[Device]) -> bytes:
        by_id, kept = self._by_id, {}
        parts = []
        for device in devices:
            entry = by_id.get(id(device))
            if entry is not None and entry[0] is device:
                record = entry[1]
            else:
                record = self._by_value.get(device) or self._record(device)
            kept[id(device)] = (device, record)
            parts.append(record)
        # Only the current devices: a long-lived stream does not grow.
        self._by_id = kept
        if len(self._by_value) > 2 * len(kept):
            self._by_value = {}
        return b"".join(parts)

    def _record(self, device: Device) -> bytes:
        body: bytes = self._encode_device(self._pb, device).SerializeToString()
        record = self._tag + _varint(len(body)) + body
        self._by_value[device] = record
        return record


def _serialize(response: Any) -> bytes:
    return response if isinstance(response, bytes) else bytes(response.SerializeToString())


def handlers(pb: ModuleType, servicer: Any) -> grpc.GenericRpcHandler[Any, Any]:
    """The DevicePlugin service of ``pb``'s version, every method from its descriptor, serving
    ``servicer``'s methods; a method may answer with a message or with its encoded bytes."""
    service = pb.DESCRIPTOR.services_by_name["DevicePlugin"]
    table: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        table[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=getattr(pb, method.input_type.name).FromString,
            response_serializer=_serialize,
        )
    return grpc.method_handlers_generic_handler(service.full_name, table)

"""Replies kept encoded: ListAndWatch lists per device, Allocate responses per grant.

A health change among 10,000 devices used to rebuild and re-serialize all 10,000 Device
messages (about 100 ms in Python). A ListAndWatchResponse is nothing but its repeated
``devices`` field, whose encoding is the concatenation of one length-delimited record per
device, so each device's record is kept until that device changes, and a new list is a join
of records. An AllocateResponse is likewise its repeated ``container_responses``: a grant the
source hands out again (a declared grant) is encoded once. The bytes reach the wire through
shim/deviceplugin/service.py, whose serializer passes bytes through. tests/unit/test_encoded.py
checks the bytes equal protobuf's own encoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from shim.incremental import EncodedList, PerObject
from shim.model import ContainerGrant, Device
from shim.slices import joined

SLICES = "lists for the kubelet"  # the kind of long work encoding a list is (shim/slices.py)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _record(tag: bytes, body: bytes) -> bytes:
    return tag + _varint(len(body)) + body


def _tag(message: Any, field: str) -> bytes:
    return _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)  # length-delimited


class DeviceNotEncodable(ValueError):
    """A device the version's messages cannot carry (protobuf refused a value), named."""

    def __init__(self, device: Device, error: Exception) -> None:
        super().__init__(f"device {device.id!r}: {type(error).__name__}: {error}")
        self.device = device


class ListEncoder:
    """One stream's ListAndWatchResponse bytes, re-encoding only devices not in the last list."""

    def __init__(self, pb: ModuleType, encode_device: Callable[[ModuleType, Device], Any]) -> None:
        self._pb = pb
        self._encode_device = encode_device
        self._tag = _tag(pb.ListAndWatchResponse, "devices")
        # By device identity: sources keep an unchanged device as the same object, and the last
        # list is held, so its ids are not reused (incremental.EncodedList).
        self._records = EncodedList(self._record)
        # By value (Device's own hash), for equal devices in new objects (a driver's full list
        # re-read); reset above twice the list's length.
        self._by_value: dict[Device, bytes] = {}

    def encode(self, devices: Sequence[Device]) -> bytes:
        message = b"".join(self._records.encode(devices))
        self._trim(len(devices))
        return message

    async def encode_in_slices(self, devices: Sequence[Device]) -> bytes:
        """``encode``, handing the event loop back every slice (shim/slices.py): a first list of
        50,000 devices is a quarter of a second of Python, and joining 25,000 records at once
        holds the loop for milliseconds."""
        message = await joined(b"", await self._records.encode_in_slices(devices, SLICES), SLICES)
        self._trim(len(devices))
        return message

    def _trim(self, listed: int) -> None:
        if len(self._by_value) > 2 * listed:  # a long-lived stream does not grow
            self._by_value = {}

    def _record(self, device: Device) -> bytes:
        record = self._by_value.get(device)
        if record is None:
            try:
                body = self._encode_device(self._pb, device).SerializeToString()
            except Exception as exc:  # protobuf's ValueError, TypeError, UnicodeError: say which device
                raise DeviceNotEncodable(device, exc) from exc
            record = self._by_value[device] = _record(self._tag, body)
        return record


class GrantEncoder:
    """AllocateResponse bytes, kept by grant identity (incremental.PerObject): sources hand out
    one object per grant (grants.ByDevices, grants.Equal), so a grant seen before is not encoded
    again; an equal grant in a new object is encoded again, a miss never a wrong answer. Safe
    because grants are frozen and each entry holds its grant, so its id is not reused; at most
    the last 1024 are kept."""

    def __init__(self, pb: ModuleType, encode_grant: Callable[[ModuleType, ContainerGrant], Any]) -> None:
        self._pb = pb
        self._encode_grant = encode_grant
        self._tag = _tag(pb.AllocateResponse, "container_responses")
        self._records = PerObject(self._record)  # by grant identity: see grants.ByDevices, Equal

    def encode(self, grants: Sequence[ContainerGrant]) -> bytes:
        return b"".join(map(self._records, grants))

    def _record(self, grant: ContainerGrant) -> bytes:
        return _record(self._tag, self._encode_grant(self._pb, grant).SerializeToString())

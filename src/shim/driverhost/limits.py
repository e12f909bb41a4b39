"""How much a driver may send devshim in one message (docs/driver-protocol.md, "Limits").

devshim runs as root, serving every resource of the node, in a container whose memory limit
its drivers share (deploy/base/daemonset.yaml: 256 MiB); a driver is untrusted. Read into
Python, JSON grows up to 20-40 times (`"a",` is a 58-byte string and an 8-byte pointer, `[],`
a 56-byte list and a pointer), so the 32 MiB line limit of the framing alone let one driver's
28 MB list take devshim from 63 MB to 619 MB and the whole node's plugins down with it. The
bounds below are checked in this order, each before what it protects is built:

1. bytes, by the stream reader, which stops at MAX_MESSAGE_BYTES instead of buffering more;
2. JSON values, counted in the raw line (in C, allocating nothing) before orjson parses it:
   that count bounds the Python objects parsing can create, whatever the message's shape;
3. devices per list, by ``len`` of the parsed list, before any device is held (a long line's
   reader, jsonrpc/sliced.py, builds devices as it reads them and hands a list past this bound
   to orjson whole, so such a list costs what it always did);
4. devices in all, by the same ``len`` against what is held already: per driver over all its
   resources (``drivers[].max_devices``) and per devshim over every driver and static resource
   (``max_devices``), so that ten resources of one driver cannot cost ten lists' worth.

Any message can carry the bulk (a log notification, an allocate answer), so 1 and 2 apply to
all of them; the largest a driver needs are device lists, so their bounds are derived from the
device bound times what one device takes on average.
"""

from __future__ import annotations

from typing import Any

from shim.jsonrpc import Transport
from shim.jsonrpc.errors import ProtocolError
from shim.slices import sliced

# The project's own goal for one resource (docs/benchmarks.md, row 5: 50,000 devices reach the
# kubelet; its 4 MiB message takes about 72,000 NVIDIA-like `GPU-<uuid>` IDs). Not more: every
# device devshim takes costs it 1.2-1.7 KB at its peak while a driver re-sends its list
# (measured: `python -m bench.flood`), so a driver flooding lists of 50,000 devices keeps devshim
# near half the DaemonSet's 256 MiB and leaves the rest to the drivers; at 100,000 devshim
# reached 180 MB.
MAX_DEVICES_PER_LIST = 50_000
# What one device may take on average over a list. A GPU-like device (a 40-character ID, health,
# one NUMA node) is 86 bytes and 8 values; one declaring a grant of an env and a mount or device
# node 160-300 bytes and 19-26 values, so a list with such grants holds about 40,000-50,000.
DEVICE_BYTES = 200
DEVICE_VALUES = 20
MAX_MESSAGE_BYTES = MAX_DEVICES_PER_LIST * DEVICE_BYTES  # 10,000,000
# Parsed, a value costs at most about 86 bytes (a one-member object), so a message at this bound
# costs devshim at most about 90 MB on top of its line while it is parsed (measured).
MAX_MESSAGE_VALUES = MAX_DEVICES_PER_LIST * DEVICE_VALUES  # 1,000,000


# Every JSON value or key but the outermost value follows one of these: "," (the next element or
# member), ":" (a member's value), "{" or "[" (a container's first member or element).
_INTRODUCERS = (b",", b":", b"{", b"[")


def json_values_at_most(line: bytes) -> int:
    """An upper bound on the values and keys in ``line`` (so on the objects parsing it creates),
    counted without parsing. Structural characters inside strings count too: an overestimate,
    never an underestimate, since no escape can stand for them outside a string."""
    return 1 + sum(map(line.count, _INTRODUCERS))


_COUNTED_AT_ONCE = 64 * 1024  # bytes counted between two looks at the clock (about 0.1 ms)


async def json_values_in_slices(line: bytes) -> int:
    """json_values_at_most, handing the event loop back between slices: a 10 MB line takes it
    about 20 ms in all. The introducers are single bytes, so slices count exactly what the whole
    line holds."""
    values = 1
    async with sliced("driver lists read") as slices:
        for start in range(0, len(line), _COUNTED_AT_ONCE):
            end = start + _COUNTED_AT_ONCE
            values += sum(line.count(introducer, start, end) for introducer in _INTRODUCERS)
            await slices.due()
    return values


class BoundedTransport:
    """A driver's side of the pipe, refusing a message with more values than MAX_MESSAGE_VALUES
    before the peer parses it (the stream reader under it already stops at MAX_MESSAGE_BYTES)."""

    def __init__(self, inner: Transport, max_values: int = MAX_MESSAGE_VALUES) -> None:
        self._inner = inner
        self._max_values = max_values

    async def read_message(self) -> bytes | None:
        line = await self._inner.read_message()
        # A line shorter than the bound cannot exceed it: the hot path (allocate answers) skips
        # the count; a list at the byte bound costs about 20 ms for it, in slices.
        if line is not None and len(line) > self._max_values:
            values = await json_values_in_slices(line)
            if values > self._max_values:
                raise ProtocolError(
                    f"a message of {len(line):,} bytes holds up to {values:,} JSON values: more than the "
                    f"{self._max_values:,} JSON values a message may hold"
                )
        return line

    async def write_message(self, data: bytes) -> None:
        await self._inner.write_message(data)

    async def close(self) -> None:
        await self._inner.close()


def device_list_refusal(method: str, message: Any, resource: Any) -> str | None:
    """Why a parsed device list (devices_changed params, a list_devices result) is over
    MAX_DEVICES_PER_LIST, or None; by its length alone, before any device is read."""
    devices = message.get("devices") if isinstance(message, dict) else None
    if not isinstance(devices, list) or len(devices) <= MAX_DEVICES_PER_LIST:
        return None  # within the bound, or no list at all: the protocol's reader says what is wrong
    about = f" for {resource!r}" if isinstance(resource, str) else ""
    return (
        f"{method}{about} lists {len(devices):,} devices: more than the "
        f"{MAX_DEVICES_PER_LIST:,} devices a list may hold"
    )


def listed_devices(message: Any) -> int | None:
    """How many devices a parsed list (devices_changed params, a list_devices result) holds, or
    None where it holds no list."""
    devices = message.get("devices") if isinstance(message, dict) else None
    return len(devices) if isinstance(devices, list) else None


def total_refusal(method: str, resource: str, listed: int, held: str, bound: int, setting: str) -> str:
    """Why a list is refused for the bound on devices in all that ``setting`` sets; ``held``
    says what the list's devices would join."""
    return (
        f"{method} for {resource!r} lists {listed:,} devices and {held}: more than the {bound:,} "
        f"devices {setting} allows in all"
    )

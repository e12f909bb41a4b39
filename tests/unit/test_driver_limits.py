"""The bounds on what a driver may send (shim/driverhost/limits.py) and on NUMA node IDs."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from adapters.sim.config import SimConfig
from shim.configfile import ConfigError
from shim.driverhost import limits
from shim.jsonrpc import StreamTransport
from shim.jsonrpc.errors import ProtocolError
from shim.model import MAX_NUMA_NODE
from shim.sdk import codec, types
from shim.sdk import config as sdk_config
from shim.settings import Settings

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner, max_size=5),
    max_leaves=30,
)


def values_and_keys(value: Any) -> int:
    """What orjson builds for ``value``: one object per value and per key."""
    if isinstance(value, list):
        return 1 + sum(map(values_and_keys, value))
    if isinstance(value, dict):
        return 1 + len(value) + sum(map(values_and_keys, value.values()))
    return 1


@settings(derandomize=True, database=None, max_examples=300)
@given(json_values)
@example({"a,b": [":", "{[", {}]})
@example("\u002c\u003a")  # escapes stand for characters only inside strings
def test_the_raw_count_never_underestimates_what_parsing_builds(value: Any) -> None:
    """The count taken before parsing bounds the objects parsing builds, whatever the shape."""
    line = orjson.dumps(value)
    assert limits.json_values_at_most(line) >= values_and_keys(orjson.loads(line))


def test_the_bounds_derive_from_the_device_bound() -> None:
    """The documented figures (docs/driver-protocol.md, "Limits")."""
    assert limits.MAX_DEVICES_PER_LIST == 50_000
    assert limits.MAX_MESSAGE_BYTES == 50_000 * 200 == 10_000_000
    assert limits.MAX_MESSAGE_VALUES == 50_000 * 20 == 1_000_000


def list_line(devices: int) -> bytes:
    record = b'{"id":"GPU-00000000-0000-4000-8000-%012d","health":"HEALTHY","numa_nodes":[0]}'
    body = b",".join(record % n for n in range(devices))
    return b'{"jsonrpc":"2.0","method":"devices_changed","params":{"resource":"r","devices":[' + body + b"]}}"


async def transported(
    lines: list[bytes], limit: int = limits.MAX_MESSAGE_BYTES
) -> list[bytes | ProtocolError]:
    """Each line read through a StreamReader with ``limit`` and the BoundedTransport over it."""
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(b"".join(line + b"\n" for line in lines))
    reader.feed_eof()
    transport = limits.BoundedTransport(StreamTransport(reader, None, limit=limit))  # type: ignore[arg-type]
    read: list[bytes | ProtocolError] = []
    while True:
        try:
            line = await transport.read_message()
        except ProtocolError as exc:
            return [*read, exc]
        if line is None:
            return read
        read.append(line)


async def test_a_list_of_the_bound_of_gpu_like_devices_passes_whole() -> None:
    """50,000 GPU-like devices (8 values and 86 bytes each) pass the byte and value bounds."""
    line = list_line(limits.MAX_DEVICES_PER_LIST)
    assert len(line) < limits.MAX_MESSAGE_BYTES
    assert await transported([line]) == [line]


async def test_too_many_values_are_refused_before_parsing() -> None:
    """1.1 million one-letter strings in 4.4 MB: under the byte bound, over the value bound."""
    line = b'{"jsonrpc":"2.0","method":"log","params":[' + b",".join([b'"a"'] * 1_100_000) + b"]}"
    (error,) = await transported([line])
    assert isinstance(error, ProtocolError)
    assert str(error) == (
        # 1,099,999 commas between the strings, their "[", and 7 for the envelope and its root.
        f"a message of {len(line):,} bytes holds up to 1,100,007 JSON values: "
        "more than the 1,000,000 JSON values a message may hold"
    )


async def test_a_message_over_the_byte_bound_is_refused_by_the_reader() -> None:
    """The reader stops at the bound instead of buffering the rest; the error names the bound."""
    small = b'{"jsonrpc":"2.0","method":"log","params":{}}'
    (first, error) = await transported([small, b'"' + b"x" * 2000 + b'"'], limit=1000)
    assert first == small
    assert str(error) == "a message is longer than the 1000-byte limit"


@pytest.mark.parametrize(
    ("message", "refusal"),
    [
        ({"devices": [{}] * 50_000}, None),
        ({"devices": [{}] * 50_001}, "devices_changed for 'r' lists 50,001 devices: more than the 50,000"),
        ({"devices": "many"}, None),  # the protocol's reader refuses it, saying why
        (None, None),
    ],
)
def test_a_device_list_over_the_bound_is_refused_by_its_length(message: Any, refusal: str | None) -> None:
    found = limits.device_list_refusal("devices_changed", message, "r")
    assert found == refusal if refusal is None else found is not None and found.startswith(refusal)


# --- NUMA node IDs ---------------------------------------------------------------------------


def test_every_side_bounds_numa_nodes_alike() -> None:
    """One bound (shim/model.py): the driver host, the settings (static devices) and the SDK apply
    it, and drivers' configurations get it from shim.sdk.config (the tests below check each)."""
    assert MAX_NUMA_NODE == sdk_config.MAX_NUMA_NODE == 1023


@pytest.mark.parametrize("numa", [2**64 - 1, 1024, -1, True])
def test_static_devices_with_a_numa_node_outside_the_kernels_range_are_refused(numa: Any) -> None:
    resources = [{"name": "example.com/a", "static": {"devices": [{"id": "a", "numa_nodes": [0, numa]}]}}]
    with pytest.raises(ConfigError, match=r"resources\[0\]\.static\.devices\[0\]\.numa_nodes\[1\]"):
        Settings.load(resources=resources)


def test_static_devices_on_numa_node_1023_are_accepted() -> None:
    resources = [{"name": "example.com/a", "static": {"devices": [{"id": "a", "numa_nodes": [0, 1023]}]}}]
    static = Settings.load(resources=resources).resources[0].static
    assert static is not None and static.devices is not None
    assert static.devices[0].numa_nodes == [0, 1023]


def test_the_sdk_refuses_to_send_a_numa_node_outside_the_kernels_range() -> None:
    """A driver on the SDK learns of sysfs's -1 read as uint64 where it makes the device."""
    assert codec.device_json(types.Device(id="a", numa_nodes=[1023]))["numa_nodes"] == [1023]
    with pytest.raises(ValueError, match=r"device 'a': numa_nodes must be integers from 0 to 1023, not 1024"):
        codec.device_json(types.Device(id="a", numa_nodes=[0, 1024]))


def test_the_simulator_refuses_a_numa_node_outside_the_kernels_range() -> None:
    resource = {"name": "example.com/sim", "devices": [{"id": "a", "numa_nodes": [1024]}]}
    with pytest.raises(ValidationError, match=r"less than or equal to 1023"):
        SimConfig.model_validate({"resources": [resource]})


# --- devices in all: per driver and per devshim ------------------------------------------------


def test_the_bounds_in_all_default_to_one_lists_worth_per_driver_and_two_drivers_per_devshim() -> None:
    """drivers[].max_devices defaults to the bound of one list, so a driver declaring ten
    resources costs what one at the list bound does; max_devices to two such drivers, where
    devshim's peak RSS stays under the DaemonSet's 256 MiB (docs/benchmarks.md, row "bound")."""
    settings = Settings.load(drivers=[{"name": "d", "command": ["d"], "resources": ["example.com/a"]}])
    assert settings.drivers[0].max_devices == limits.MAX_DEVICES_PER_LIST == 50_000
    assert settings.max_devices == 100_000


def test_static_devices_over_max_devices_are_a_config_error_naming_the_setting() -> None:
    """Static devices count toward max_devices like a driver's: more than it is refused at load."""
    resources = [
        {"name": "example.com/a", "static": {"count": 60}},
        {"name": "example.com/b", "static": {"devices": [{"id": f"b{n}"} for n in range(50)]}},
    ]
    with pytest.raises(
        ConfigError, match=r"resources list 110 static devices: more than the 100 max_devices"
    ):
        Settings.load(resources=resources, max_devices=100)
    assert Settings.load(resources=resources, max_devices=110).max_devices == 110


@pytest.mark.parametrize("where", ["max_devices", "drivers"])
def test_a_bound_in_all_below_one_device_is_refused(where: str) -> None:
    driver: dict[str, Any] = {"name": "d", "command": ["d"], "resources": ["example.com/a"]}
    if where == "drivers":
        driver["max_devices"] = 0
    extra: dict[str, Any] = {"max_devices": 0} if where == "max_devices" else {}
    with pytest.raises(ConfigError, match=r"max_devices: Input should be greater than or equal to 1"):
        Settings.load(drivers=[driver], **extra)


@pytest.mark.parametrize(
    ("message", "count"),
    [({"devices": [{}] * 3}, 3), ({"devices": []}, 0), ({"devices": "many"}, None), ([], None), (None, None)],
)
def test_a_list_is_counted_by_its_length_alone(message: Any, count: int | None) -> None:
    assert limits.listed_devices(message) == count

"""jsonrpc/sliced.py: long lines read in slices read as orjson reads them, and unchanged elements
of a re-sent array are the last array's very objects (what the driver host's caches rely on)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shim.driverhost import protocol
from shim.driverhost.source import DriverSource
from shim.jsonrpc.sliced import SlicedReader
from shim.model import Capabilities, Health

SMALL = 256  # min_bytes for the property tests: short lines take the sliced path too


def _reader(**kwargs: Any) -> SlicedReader:
    return SlicedReader(lambda element: element, min_bytes=SMALL, **kwargs)


def _read(reader: SlicedReader, line: bytes) -> Any:
    return asyncio.run(reader.read(line))


def _devices(count: int, unhealthy: int | None = None, prefix: str = "GPU") -> list[dict[str, Any]]:
    return [
        {
            "id": f"{prefix}-{n:05d}",
            "health": "UNHEALTHY" if n == unhealthy else "HEALTHY",
            "numa_nodes": [n % 2],
        }
        for n in range(count)
    ]


def _changed(devices: list[dict[str, Any]], resource: str = "example.com/gpu") -> bytes:
    return orjson.dumps(
        {"jsonrpc": "2.0", "method": "devices_changed", "params": {"resource": resource, "devices": devices}}
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    """JSON-RPC lines as drivers write them, and as they should not: any member order, any
    spacing, elements of any JSON type, ``devices`` where it counts and where it does not."""
    elements = draw(
        st.lists(
            st.fixed_dictionaries({"id": st.text(max_size=6)}, optional={"x": json_values}) | json_values,
            max_size=12,
        )
    )
    inner = draw(st.dictionaries(st.sampled_from(["resource", "devices", "other"]), json_values, max_size=3))
    inner["devices"] = elements
    outer = {"jsonrpc": "2.0", draw(st.sampled_from(["params", "result", "error"])): inner}
    outer.update(draw(st.dictionaries(st.sampled_from(["method", "id", "devices"]), json_values, max_size=2)))
    spaced = draw(st.booleans())
    text = json.dumps(outer, indent=1 if spaced else None, separators=None if spaced else (",", ":"))
    return (text + " " * SMALL).encode() if text.isascii() else text.encode()


def _same_as_orjson(reader: SlicedReader, line: bytes) -> None:
    try:
        expected = orjson.loads(line)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            _read(reader, line)
        return
    assert _read(reader, line) == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=messages(),
    second=messages(),
    cut=st.integers(0, 400),
    junk=st.sampled_from(["", "x", "]", "}", ",", "NaN", "\\u"]),
)
def test_reads_what_orjson_reads_and_refuses_what_it_refuses(
    first: bytes, second: bytes, cut: int, junk: str
) -> None:
    reader = _reader()
    _same_as_orjson(reader, first)  # leaves arrays kept, for the second to be compared with
    _same_as_orjson(reader, second)
    _same_as_orjson(reader, first)
    broken = first[:cut] + junk.encode() + first[cut:]
    _same_as_orjson(reader, broken)
    _same_as_orjson(reader, first)


@pytest.mark.parametrize("depth", [900, 1022, 5000])
def test_a_deeply_nested_element_reads_as_orjson_reads_it(depth: int) -> None:
    """orjson refuses nesting deeper than 1,024 in the whole line; the reader, which reads each
    element on its own, must not accept what the whole line would not be."""
    element = "[" * depth + "]" * depth
    line = ('{"jsonrpc":"2.0","method":"devices_changed","params":{"devices":[' + element + "]}}").encode()
    _same_as_orjson(_reader(), line + b" " * SMALL)


def test_a_number_element_longer_than_the_one_kept_is_read_whole() -> None:
    reader = _reader()
    assert (
        _read(
            reader, orjson.dumps({"jsonrpc": "2.0", "result": {"devices": [{"id": "a"}, 1, 2, "p" * SMALL]}})
        )
        is not None
    )
    line = orjson.dumps({"jsonrpc": "2.0", "result": {"devices": [{"id": "a"}, 12, 2.5, "p" * SMALL]}})
    assert _read(reader, line) == orjson.loads(line)


def test_a_re_sent_list_hands_over_the_unchanged_elements_again() -> None:
    reader = SlicedReader(protocol.device_from_json)
    first = _read(reader, _changed(_devices(2000)))["params"]["devices"]
    second = _read(reader, _changed(_devices(2000, unhealthy=7)))["params"]["devices"]
    assert all(isinstance(device, tuple) for device in second)  # read as they came
    assert [n for n in range(2000) if second[n] is not first[n]] == [7]
    assert second[7][0].health is Health.UNHEALTHY and first[7][0].health is Health.HEALTHY
    # A list beginning with another device is compared with nothing, and read whole.
    other = _read(reader, _changed(_devices(2000, prefix="NPU")))["params"]["devices"]
    assert other[0][0].id == "NPU-00000" and not any(a is b for a, b in zip(first, other, strict=True))
    # Each first device keeps its own list: the GPU list is still the one compared with.
    third = _read(reader, _changed(_devices(2000)))["params"]["devices"]
    assert [n for n in range(2000) if third[n] is not second[n]] == [7]


def test_a_device_the_converter_refuses_stays_json_for_the_host_to_refuse() -> None:
    reader = SlicedReader(protocol.device_from_json)
    devices = _devices(2000)
    devices[3]["numa_nodes"] = [99999]
    params = _read(reader, _changed(devices))["params"]
    assert params["devices"][3] == devices[3]
    with pytest.raises(protocol.DriverProtocolError, match="numa_nodes"):
        protocol.devices_from_json(params)
    duplicate = _devices(2000)
    duplicate[5]["id"] = duplicate[4]["id"]
    with pytest.raises(protocol.DriverProtocolError, match="twice"):
        protocol.devices_from_json(_read(reader, _changed(duplicate))["params"])


def test_a_list_over_the_element_bound_is_left_to_orjson_whole() -> None:
    reader = SlicedReader(protocol.device_from_json, max_elements=1999)
    line = _changed(_devices(2000))
    assert _read(reader, line) == orjson.loads(line)  # JSON objects, for the host to refuse by length
    assert isinstance(_read(SlicedReader(protocol.device_from_json), line)["params"]["devices"][0], tuple)


def test_arrays_kept_stay_within_their_bound() -> None:
    one = len(_changed(_devices(2000)))
    reader = SlicedReader(protocol.device_from_json, keep_chars=2 * one)
    lists = {
        prefix: _read(reader, _changed(_devices(2000, prefix=prefix)))["params"]["devices"]
        for prefix in "ABC"
    }
    # A's list was dropped to keep B's and C's: A again is read anew, C again is reused.
    assert _read(reader, _changed(_devices(2000, prefix="A")))["params"]["devices"][1] is not lists["A"][1]
    assert _read(reader, _changed(_devices(2000, prefix="C")))["params"]["devices"][1] is lists["C"][1]


def test_a_long_list_hands_the_loop_back_while_it_is_read() -> None:
    reader = SlicedReader(protocol.device_from_json)
    line = _changed(_devices(50_000))

    async def main() -> int:
        turns = 0
        reading = asyncio.create_task(reader.read(line))
        while not reading.done():
            turns += 1
            await asyncio.sleep(0)
        assert len((await reading)["params"]["devices"]) == 50_000
        return turns

    # Read whole, the line would take one turn; in slices of 2 ms, 50,000 devices take many.
    assert asyncio.run(main()) > 5


def test_the_source_holds_what_the_re_sent_list_says_after_a_health_change() -> None:
    """A health change, then the same list again: the list is the truth, though its devices are
    the very objects of the list before the change."""
    reader = SlicedReader(protocol.device_from_json)

    async def main() -> None:
        async def no_calls(*_: Any) -> Any:
            raise AssertionError("no driver calls here")

        source = DriverSource(protocol.ResourceInfo("example.com/gpu", Capabilities()), no_calls)
        line = _changed(_devices(2000))
        source.take_devices(protocol.devices_from_json((await reader.read(line))["params"]))
        source.take_health({"GPU-00003": Health.UNHEALTHY})
        await source.publish()
        assert (await source.list_devices())[3].health is Health.UNHEALTHY
        source.take_devices(protocol.devices_from_json((await reader.read(line))["params"]))
        source.take_health({"GPU-01999": Health.UNHEALTHY})  # found through the index kept
        await source.publish()
        held = await source.list_devices()
        assert len(held) == 2000 and held[3].health is Health.HEALTHY
        assert held[1999].health is Health.UNHEALTHY

    asyncio.run(main())

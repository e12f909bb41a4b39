"""shim/revision.py: a re-sent list taken as a revision (its changes alone) leaves every holder
exactly as a plain list would: the driver's source, the resource, the encoders, the checks."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shim import revision
from shim.core.resource import ResourceService
from shim.driverhost import protocol
from shim.driverhost.source import DriverSource
from shim.errors import ShimError
from shim.incremental import EncodedList
from shim.jsonrpc.sliced import SlicedReader
from shim.model import Capabilities, Health

COUNT = 40


def _line(devices: list[dict[str, Any]]) -> bytes:
    params = {"resource": "example.com/gpu", "devices": devices}
    return orjson.dumps({"jsonrpc": "2.0", "method": "devices_changed", "params": params}) + b" " * 256


def _device(n: int) -> dict[str, Any]:
    return {"id": f"GPU-{n:03d}", "health": "HEALTHY", "numa_nodes": [n % 2]}


# What a driver changes between two lists: a health, a grant declared or withdrawn, an ID
# (to a new one, or to one the list holds already), the length; several at once.
change = st.one_of(
    st.tuples(st.just("health"), st.integers(0, COUNT - 1), st.sampled_from(["HEALTHY", "UNHEALTHY"])),
    st.tuples(st.just("grant"), st.integers(0, COUNT - 1), st.sampled_from([None, "A", "B"])),
    st.tuples(st.just("id"), st.integers(0, COUNT - 1), st.integers(0, COUNT + 5)),
    st.tuples(st.just("length"), st.integers(COUNT - 3, COUNT), st.none()),
)


def _apply(devices: list[dict[str, Any]], changes: list[tuple[str, int, Any]]) -> list[dict[str, Any]]:
    devices = [dict(d) for d in devices]
    for kind, at, value in changes:
        if kind == "length":
            devices = devices[:at] + [_device(n) for n in range(len(devices), at)]
        elif at >= len(devices):
            continue
        elif kind == "health":
            devices[at]["health"] = value
        elif kind == "grant" and value is None:
            devices[at].pop("grant", None)
        elif kind == "grant":
            devices[at]["grant"] = {"envs": {"GRANT": value}}
        else:
            devices[at]["id"] = f"GPU-{value:03d}"
    return devices


async def _no_calls(*_: Any) -> Any:
    raise AssertionError("no driver calls here")


def _take(source: DriverSource, params: Any) -> str | None:
    """What taking the list does: the refusal's message, or None."""
    try:
        source.take_devices(source.devices_from_json(params))
    except ShimError as exc:
        return str(exc)
    return None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(change, max_size=3), min_size=1, max_size=8))
def test_a_list_taken_as_a_revision_leaves_every_holder_as_a_plain_list_does(
    steps: list[list[tuple[str, int, Any]]],
) -> None:
    async def main() -> None:
        reader = SlicedReader(protocol.device_from_json, min_bytes=64)
        info = protocol.ResourceInfo("example.com/gpu", Capabilities())
        revised, plain = DriverSource(info, _no_calls), DriverSource(info, _no_calls)
        resource = ResourceService("example.com/gpu", revised)
        starting = asyncio.create_task(resource.start())  # ends with the first list published
        encoded, encoded_plain = EncodedList(repr), EncodedList(repr)
        devices = [_device(n) for n in range(COUNT)]
        revisions = 0
        for step in [[], [], *steps]:  # the first list, then the same again
            devices = _apply(devices, step)
            params = (await reader.read(_line(devices)))["params"]
            revisions += isinstance(params["devices"], revision.RevisedList)
            # The plain source reads the same objects, in a list that says nothing.
            assert _take(revised, params) == _take(plain, {**params, "devices": list(params["devices"])})
            assert revised._real == plain._real and revised._index == plain._index
            assert revised._declared == plain._declared
            await revised.publish()
            await starting
            held = await revised.list_devices()
            async with asyncio.timeout(5):
                while resource.devices is not held:
                    await asyncio.sleep(0)
            assert resource._by_id == {d.id: d for d in held}
            assert resource._healthy == sum(d.health is Health.HEALTHY for d in held)
            assert list(encoded.encode(held)) == list(encoded_plain.encode(tuple(held)))
        assert revisions >= 1  # the same list again, at least, is a revision
        await resource.stop()

    asyncio.run(main())


def test_a_re_sent_list_names_exactly_the_devices_read_anew() -> None:
    reader = SlicedReader(protocol.device_from_json, min_bytes=64)
    devices = [_device(n) for n in range(COUNT)]
    first = asyncio.run(reader.read(_line(devices)))["params"]["devices"]
    devices[3]["health"], devices[30]["health"] = "UNHEALTHY", "UNHEALTHY"
    second = asyncio.run(reader.read(_line(devices)))["params"]["devices"]
    assert revision.changes(second, first) == (3, 30)
    assert revision.changes(second, list(first)) is None  # a revision of that very list only
    shorter = asyncio.run(reader.read(_line(devices[:-1])))["params"]["devices"]
    assert revision.changes(shorter, second) is None  # another length: no revision


def test_a_revision_that_repeats_an_id_is_refused_as_any_list_is() -> None:
    reader = SlicedReader(protocol.device_from_json, min_bytes=64)
    info = protocol.ResourceInfo("example.com/gpu", Capabilities())
    source = DriverSource(info, _no_calls)
    devices = [_device(n) for n in range(COUNT)]
    assert _take(source, asyncio.run(reader.read(_line(devices)))["params"]) is None
    devices[5]["id"] = devices[4]["id"]
    params = asyncio.run(reader.read(_line(devices)))["params"]
    assert revision.changes(params["devices"], source._taken) == (5,)
    with pytest.raises(protocol.DriverProtocolError, match="twice"):
        source.devices_from_json(params)

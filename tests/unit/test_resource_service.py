"""The core's request rules, shared by every API version and every source."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest

from shim.core.resource import ResourceService
from shim.errors import RequestError, SourceTimeout, UnhealthyDevice, UnknownDevice, grpc_status
from shim.model import (
    Capabilities,
    ContainerAllocateRequest,
    Device,
    Health,
    PreferredAllocationRequest,
)
from shim.sources import StaticSource


class SloppyPreferenceSource(StaticSource):
    """Prefers unknown, duplicate and too many IDs and forgets must-include."""

    async def preferred_allocation(self, request: PreferredAllocationRequest) -> list[str]:
        return ["ghost", "d3", "d3", "d2", "d1", "d0"]


class SlowPrestartSource(StaticSource):
    async def prestart(self, device_ids: Sequence[str]) -> None:
        await asyncio.sleep(10)


def devices(n: int = 4) -> list[Device]:
    return [Device(f"d{i}") for i in range(n)]


@pytest.fixture
async def service() -> AsyncIterator[ResourceService]:
    svc = ResourceService("example.com/foo", StaticSource(devices()))
    await svc.start()
    yield svc
    await svc.stop()


async def test_unknown_device_ids_are_invalid_argument_naming_the_id(service: ResourceService) -> None:
    """Allocate of an ID the plugin never listed fails with INVALID_ARGUMENT naming it."""
    with pytest.raises(UnknownDevice) as info:
        await service.allocate([ContainerAllocateRequest(("d0", "nope"))])
    code, message = grpc_status(info.value)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "'nope'" in message


async def test_unhealthy_devices_cannot_be_allocated() -> None:
    """Allocate of an Unhealthy device fails with INVALID_ARGUMENT naming it."""
    source = StaticSource(devices())
    svc = ResourceService("example.com/foo", source)
    await svc.start()
    await source.set_health("d2", Health.UNHEALTHY)
    watch = svc.watch()
    while (await anext(watch))[2].health is not Health.UNHEALTHY:
        pass
    with pytest.raises(UnhealthyDevice, match="'d2' is Unhealthy"):
        await svc.allocate([ContainerAllocateRequest(("d2",))])
    await watch.aclose()
    await svc.stop()


async def test_one_grant_per_container_in_order(service: ResourceService) -> None:
    """Each container request gets its own grant, in request order."""
    grants = await service.allocate(
        [ContainerAllocateRequest(("d0",)), ContainerAllocateRequest(("d1", "d2"))]
    )
    assert len(grants) == 2


async def test_preferred_allocation_is_exact_even_when_the_source_is_sloppy() -> None:
    """Exactly allocation_size IDs, all must-include among them, none unknown or repeated."""
    svc = ResourceService(
        "example.com/foo", SloppyPreferenceSource(devices(), capabilities=Capabilities(True))
    )
    await svc.start()
    chosen = await svc.preferred_allocation(PreferredAllocationRequest(("d0", "d1", "d2", "d3"), ("d1",), 3))
    assert chosen == ("d1", "d3", "d2")
    await svc.stop()


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        pytest.param(PreferredAllocationRequest(("d0",), (), 2), "exceeds the 1 available", id="too-big"),
        pytest.param(
            PreferredAllocationRequest(("d0", "d1"), ("d0", "d1"), 1), "smaller than", id="too-small"
        ),
        pytest.param(PreferredAllocationRequest(("d0", "zz"), (), 1), "unknown device ID 'zz'", id="unknown"),
    ],
)
async def test_impossible_preferred_allocation_requests_are_refused(
    service: ResourceService, request_: PreferredAllocationRequest, fragment: str
) -> None:
    """A request no answer could satisfy is INVALID_ARGUMENT, not a silently wrong answer."""
    with pytest.raises(RequestError, match=fragment):
        await service.preferred_allocation(request_)


async def test_a_slow_prestart_fails_inside_the_kubelet_deadline() -> None:
    """PreStartContainer answers DEADLINE_EXCEEDED before the kubelet's own 30 s timeout."""
    svc = ResourceService(
        "example.com/foo",
        SlowPrestartSource(devices(), capabilities=Capabilities(pre_start=True)),
        prestart_timeout_s=0.2,
    )
    await svc.start()
    with pytest.raises(SourceTimeout) as info:
        await svc.prestart(("d0",))
    assert grpc_status(info.value)[0] is grpc.StatusCode.DEADLINE_EXCEEDED
    await svc.stop()


async def test_watchers_see_the_list_at_once_and_every_change(service: ResourceService) -> None:
    """Two watchers each get the full list immediately and a full new list after a change."""
    first, second = service.watch(), service.watch()
    assert len(await anext(first)) == len(await anext(second)) == 4
    assert isinstance(service.source, StaticSource)
    await service.source.set_devices(devices(5))
    assert len(await anext(first)) == len(await anext(second)) == 5
    await first.aclose()
    await second.aclose()


async def test_a_sources_list_is_the_resources_when_the_source_has_shown_it(service: ResourceService) -> None:
    """One hop from source to resource (sources/base.py, ``feed``): once the source has handed a
    list on, the next kubelet call is checked against it, with no task between to wait for."""
    assert isinstance(service.source, StaticSource)
    await service.source.set_devices(devices(2))
    assert [d.id for d in service.devices] == ["d0", "d1"]
    with pytest.raises(UnknownDevice):
        await service.allocate([ContainerAllocateRequest(("d3",))])

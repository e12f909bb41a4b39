"""A resource served through both the device plugin API and DRA (core/holds.py): a device is
held by one API at a time, withdrawn from the other, and a request that races for it fails
naming the holder; the core's service carries each API its own view."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest

from shim.core.holds import Holds
from shim.core.resource import ResourceService
from shim.errors import DeviceHeld, SourceFailed, grpc_status
from shim.model import ContainerAllocateRequest, ContainerGrant, Device, Health
from shim.sources import StaticSource

CLAIM = "claim default/c (uid-1)"
OTHER = "claim default/d (uid-2)"


def test_a_claims_devices_are_unhealthy_to_the_device_plugin_and_refused_to_it() -> None:
    holds = Holds("example.com/gpu")
    devices = (Device("a"), Device("b"), Device("c", Health.UNHEALTHY))
    assert holds.claim_prepared(["a", "c"], CLAIM)
    assert not holds.claim_prepared(["a"], CLAIM), "the same hold again changes nothing"
    assert [d.health for d in holds.for_plugin(devices)] == [
        Health.UNHEALTHY,
        Health.HEALTHY,
        Health.UNHEALTHY,
    ]
    assert holds.for_dra(devices) == devices
    with pytest.raises(DeviceHeld) as refused:
        holds.check_for_plugin(["b", "a"])
    code, message = grpc_status(refused.value)
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert message.startswith(
        f"example.com/gpu: device 'a' is held by {CLAIM} through DRA; the device plugin API"
    )
    holds.check_for_claim(["a"], CLAIM)  # its own devices again: a repeated prepare
    with pytest.raises(DeviceHeld, match=re.escape(f"held by {CLAIM} through DRA; {OTHER} cannot")):
        holds.check_for_claim(["a"], OTHER)
    # Only the claim that holds a device gives it back.
    assert not holds.claim_freed(["a", "c"], OTHER)
    assert holds.for_plugin(devices) != devices
    assert holds.claim_freed(["a", "c"], CLAIM) and not holds.claim_freed(["a"], CLAIM)
    assert holds.for_plugin(devices) == devices
    holds.check_for_plugin(["a"])


def test_a_containers_devices_leave_the_dra_pool_until_the_kubelet_frees_them() -> None:
    holds = Holds("example.com/gpu")
    devices = (Device("a"), Device("b"), Device("c"))
    assert holds.plugin_allocated(["a", "b"])
    assert [d.id for d in holds.for_dra(devices)] == ["c"]
    assert holds.for_plugin(devices) == devices
    with pytest.raises(
        DeviceHeld, match=r"device 'b' is held by a container through the device plugin API \(allocated "
    ):
        holds.check_for_claim(["c", "b"], CLAIM)
    # The kubelet gives "b" to another container: the older group is superseded, "a" is free.
    assert holds.plugin_allocated(["b"])
    assert [d.id for d in holds.for_dra(devices)] == ["a", "c"]
    assert holds.status() == {"dra": [], "device_plugin": ["b"]}
    assert holds.plugin_freed(["b"]) and not holds.plugin_freed(["b"])
    assert holds.for_dra(devices) == devices
    # What PodResources lists is held too (a restarted devshim knows of no Allocate), until it
    # is listed no more.
    assert holds.plugin_listed(["c"]) and not holds.plugin_listed(["c"])
    assert [d.id for d in holds.for_dra(devices)] == ["a", "b"]
    with pytest.raises(
        DeviceHeld,
        match=re.escape(
            "device 'c' is held by a container through the device plugin API (listed by PodResources)"
        ),
    ):
        holds.check_for_claim(["c"], CLAIM)
    assert holds.status() == {"dra": [], "device_plugin": ["c"]}
    assert holds.plugin_listed([]) and holds.for_dra(devices) == devices


class HeldAnswer(StaticSource):
    """Answers Allocate only when told: a request is in flight while the test acts."""

    def __init__(self, devices: list[Device]) -> None:
        super().__init__(devices)
        self.arrived = asyncio.Event()
        self.answer = asyncio.Event()
        self.fail = False

    async def allocate(self, requests: Sequence[ContainerAllocateRequest]) -> list[ContainerGrant]:
        self.arrived.set()
        await self.answer.wait()
        if self.fail:
            raise SourceFailed("the driver failed")
        return [ContainerGrant() for _ in requests]


@pytest.fixture
async def shared() -> AsyncIterator[tuple[ResourceService, HeldAnswer]]:
    source = HeldAnswer([Device(f"g{i}") for i in range(3)])
    service = ResourceService("example.com/gpu", source)
    await service.start()
    await service.serve_dra({"g2": CLAIM}, listed=())  # a claim checkpointed before a restart
    yield service, source
    await service.stop()


async def latest(updates: AsyncIterator[tuple[Device, ...]]) -> tuple[Device, ...]:
    return await anext(updates)


async def test_each_api_sees_the_others_holds_while_a_request_is_in_flight(
    shared: tuple[ResourceService, HeldAnswer],
) -> None:
    service, source = shared
    plugin_view, dra_view = service.watch(), service.watch_dra()
    assert [d.health for d in await latest(plugin_view)] == [Health.HEALTHY, Health.HEALTHY, Health.UNHEALTHY]
    assert [d.id for d in await latest(dra_view)] == ["g0", "g1", "g2"]
    with pytest.raises(DeviceHeld, match=re.escape(f"held by {CLAIM} through DRA")):
        await service.allocate([ContainerAllocateRequest(("g2",))])
    # An Allocate in flight holds g0 from its start: a claim racing for it loses at once.
    call = asyncio.create_task(service.allocate([ContainerAllocateRequest(("g0",))]))
    await source.arrived.wait()
    assert [d.id for d in await latest(dra_view)] == ["g1", "g2"]
    with pytest.raises(DeviceHeld, match="held by a container through the device plugin API"):
        await service.prepare(["g0"], OTHER)
    source.answer.set()
    assert await call == [ContainerGrant()]
    assert [d.id for d in service.dra_devices] == ["g1", "g2"]
    # The emulation (or v1beta2's Deallocate) frees it: back in the pool.
    await service.deallocate(["g0"])
    assert [d.id for d in await latest(dra_view)] == ["g0", "g1", "g2"]
    # An unprepared claim's device is healthy to the device plugin again.
    await service.unprepare(["g2"], CLAIM)
    assert [d.health for d in await latest(plugin_view)] == [Health.HEALTHY] * 3


async def test_a_failed_request_holds_nothing(shared: tuple[ResourceService, HeldAnswer]) -> None:
    service, source = shared
    source.fail = True
    source.answer.set()
    with pytest.raises(SourceFailed):
        await service.allocate([ContainerAllocateRequest(("g0",))])
    assert [d.id for d in service.dra_devices] == ["g0", "g1", "g2"]
    with pytest.raises(SourceFailed):
        await service.prepare(["g1"], OTHER)
    assert service.holds is not None and service.holds.status() == {"dra": ["g2"], "device_plugin": []}

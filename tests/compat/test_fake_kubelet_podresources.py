"""Tests of the fake kubelet's pods and its PodResources service, against a scripted test double."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from shim.compat.fakekubelet import (
    AdmissionRejected,
    AssignedDevice,
    CleanupMode,
    ContainerSpec,
    DeviceState,
    FakeKubelet,
    PluginOptions,
    PluginSession,
    PodContainer,
    RunningPod,
)
from shim.compat.fakekubelet.podresources import PodResourcesReader
from shim.compat.fakekubelet.ratelimit import TokenBucket
from tests.support.scripted import PluginScript
from tests.support.scripted_plugin import ScriptedPlugin

RESOURCE = "example.com/widget"
FOUR = tuple(DeviceState(f"w{i}", "Healthy") for i in range(4))
ALL_OPTIONS = PluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


def widgets(*ids: str) -> tuple[AssignedDevice, ...]:
    return tuple(AssignedDevice(RESOURCE, device) for device in ids)


def app(name: str, count: int, resource: str = RESOURCE) -> ContainerSpec:
    return ContainerSpec(name, resource, count)


def init(name: str, count: int) -> ContainerSpec:
    return ContainerSpec(name, RESOURCE, count, init=True)


def new_kubelet(root: Path, rate: tuple[float, int] | None = (100.0, 10)) -> FakeKubelet:
    socket = root / "pod-resources" / "kubelet.sock"
    return FakeKubelet(root / "device-plugins", pod_resources_socket=socket, pod_resources_rate=rate)


def reader(kubelet: FakeKubelet) -> PodResourcesReader:
    assert kubelet.pod_resources_socket is not None
    return PodResourcesReader(kubelet.pod_resources_socket)


async def registered(
    kubelet: FakeKubelet, devices: tuple[DeviceState, ...] = FOUR, options: PluginOptions | None = None
) -> tuple[ScriptedPlugin, PluginSession]:
    plugin = ScriptedPlugin(kubelet.plugin_dir / "p.sock", PluginScript(options=options, devices=devices))
    await plugin.start()
    await plugin.register(kubelet.kubelet_socket, RESOURCE)
    session = kubelet.plugin(RESOURCE)
    await session.wait_for_list()
    return plugin, session


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[FakeKubelet]:
    """Instead of tests/conftest.py's: new_kubelet's, serving PodResources beside device-plugins/."""
    async with new_kubelet(plugin_dir) as kubelet:
        yield kubelet


@pytest.fixture
async def plugin(kubelet: FakeKubelet) -> AsyncIterator[ScriptedPlugin]:
    plugin, _ = await registered(kubelet)
    yield plugin
    await plugin.stop()


# -- List and admission -----------------------------------------------------------------------------


@pytest.mark.usefixtures("plugin")
async def test_list_shows_each_running_pod_with_its_app_containers(kubelet: FakeKubelet) -> None:
    """Every running pod, each app container with its devices (none for a container without)."""
    async with reader(kubelet) as pods:
        assert await pods.list() == []
        assert await kubelet.run_pod("ns", "a", [app("main", 2), app("log", 0)]) == {
            "main": ["w0", "w1"],
            "log": [],
        }
        await kubelet.run_pod("ns", "b", [app("main", 1)])
        assert await pods.list() == [
            RunningPod("ns", "a", (PodContainer("main", widgets("w0", "w1")), PodContainer("log"))),
            RunningPod("ns", "b", (PodContainer("main", widgets("w2")),)),
        ]


async def test_an_app_container_reuses_the_devices_of_init_containers(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """The same ids are allocated again for the app container; init containers are never listed."""
    ids = await kubelet.run_pod("ns", "job", [init("setup", 2), app("main", 2)])
    assert ids == {"setup": ["w0", "w1"], "main": ["w0", "w1"]}
    assert plugin.script.allocate_calls == [[("w0", "w1")], [("w0", "w1")]]
    assert kubelet.plugin(RESOURCE).in_use == {"w0", "w1"}
    async with reader(kubelet) as pods:
        assert await pods.list() == [RunningPod("ns", "job", (PodContainer("main", widgets("w0", "w1")),))]


async def test_reuse_is_partial_and_goes_to_one_app_container(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """A bigger request takes the reusable ids plus free ones; a second app container gets none."""
    ids = await kubelet.run_pod("ns", "job", [app("first", 2), init("setup", 1), app("second", 1)])
    assert ids == {"setup": ["w0"], "first": ["w0", "w1"], "second": ["w2"]}
    assert kubelet.plugin(RESOURCE).in_use == {"w0", "w1", "w2"}


async def test_reused_devices_are_must_include_for_the_preferred_allocation(kubelet: FakeKubelet) -> None:
    """manager.go asks GetPreferredAllocation with the reused devices as must-include."""
    plugin, _ = await registered(kubelet, options=ALL_OPTIONS)
    try:
        ids = await kubelet.run_pod("ns", "job", [init("setup", 1), app("main", 2)])
        assert ids == {"setup": ["w3"], "main": ["w3", "w2"]}
        (request,) = plugin.script.preferred_calls[1]
        assert (request.available, request.must_include, request.size) == (
            ("w3", "w0", "w1", "w2"),
            ("w3",),
            2,
        )
        # PreStartContainer as each container starts: the init container first.
        assert plugin.script.prestart_calls == [("w3",), ("w3", "w2")]
    finally:
        await plugin.stop()


async def test_end_pod_removes_it_and_frees_its_devices(kubelet: FakeKubelet, plugin: ScriptedPlugin) -> None:
    """An ended pod leaves List and its devices go to the next pod."""
    await kubelet.run_pod("ns", "a", [init("setup", 1), app("main", 4)])
    with pytest.raises(AdmissionRejected, match="Requested: 1, Available: 0"):
        await kubelet.run_pod("ns", "b", [app("main", 1)])
    await kubelet.end_pod("ns", "a")
    assert kubelet.plugin(RESOURCE).in_use == frozenset() and kubelet.pods == []
    assert await kubelet.run_pod("ns", "b", [app("main", 4)]) == {"main": ["w0", "w1", "w2", "w3"]}
    async with reader(kubelet) as pods:
        assert [pod.name for pod in await pods.list()] == ["b"]
    with pytest.raises(KeyError, match="no running pod ns/a"):
        await kubelet.end_pod("ns", "a")


async def test_a_pod_that_cannot_be_admitted_holds_nothing(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """A failed admission frees what earlier containers of the pod got, and the pod never runs."""
    with pytest.raises(AdmissionRejected, match="Requested: 3, Available: 2"):
        await kubelet.run_pod("ns", "big", [app("a", 2), app("b", 3)])
    assert kubelet.plugin(RESOURCE).in_use == frozenset() and kubelet.pods == []


@pytest.mark.usefixtures("plugin")
async def test_run_pod_checks_what_it_is_given(kubelet: FakeKubelet) -> None:
    """Duplicate pods or container names, and unregistered resources, are refused."""
    with pytest.raises(ValueError, match="unique"):
        await kubelet.run_pod("ns", "a", [app("main", 1), app("main", 1)])
    with pytest.raises(AdmissionRejected, match="cannot allocate unregistered device example.com/gizmo"):
        await kubelet.run_pod("ns", "a", [app("main", 1, "example.com/gizmo")])
    await kubelet.run_pod("ns", "a", [app("main", 1)])
    with pytest.raises(ValueError, match="already running"):
        await kubelet.run_pod("ns", "a", [app("main", 1)])


async def test_pods_and_their_devices_survive_a_kubelet_restart(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """Running pods keep their devices across a restart, as the checkpoint does."""
    await kubelet.run_pod("ns", "a", [app("main", 3)])
    await kubelet.restart(CleanupMode.KUBELET_1_33)
    await plugin.stop()
    await plugin.start()
    await plugin.register(kubelet.kubelet_socket, RESOURCE)
    await kubelet.plugin(RESOURCE).wait_for_list()
    async with reader(kubelet) as pods:
        assert [pod.name for pod in await pods.list()] == ["a"]
    assert await kubelet.run_pod("ns", "b", [app("main", 1)]) == {"main": ["w3"]}


# -- Get and GetAllocatableResources ---------------------------------------------------------------


@pytest.mark.usefixtures("plugin")
async def test_get_answers_one_pod_and_refuses_an_unknown_one(kubelet: FakeKubelet) -> None:
    """Get returns the pod like List does; an absent pod is server_v1.go's plain error (UNKNOWN)."""
    await kubelet.run_pod("ns", "a", [init("setup", 1), app("main", 1)])
    async with reader(kubelet) as pods:
        assert await pods.get("ns", "a") == RunningPod("ns", "a", (PodContainer("main", widgets("w0")),))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await pods.get("other", "a")
    assert raised.value.code() == grpc.StatusCode.UNKNOWN
    assert raised.value.details() == "pod a in namespace other not found"


async def test_allocatable_lists_healthy_devices_per_numa_node(kubelet: FakeKubelet) -> None:
    """Healthy devices only, one entry per NUMA node (none without topology); none once gone."""
    devices = (
        DeviceState("w0", "Healthy", (0, 1)),
        DeviceState("w1", "Unhealthy"),
        DeviceState("w2", "Healthy"),
    )
    plugin, session = await registered(kubelet, devices)
    async with reader(kubelet) as pods:
        assert await pods.allocatable() == (
            AssignedDevice(RESOURCE, "w0", (0,)),
            AssignedDevice(RESOURCE, "w0", (1,)),
            AssignedDevice(RESOURCE, "w2"),
        )
        await kubelet.run_pod("ns", "a", [app("main", 1)])
        assert len(await pods.allocatable()) == 3, "capacity, not what is free"
        (pod,) = await pods.list()
        assert pod.container("main").devices == (
            AssignedDevice(RESOURCE, "w0", (0,)),
            AssignedDevice(RESOURCE, "w0", (1,)),
        )
        await plugin.stop()
        async with asyncio.timeout(5):
            await session.stream_ended.wait()
        assert await pods.allocatable() == ()


# -- rate limiting ---------------------------------------------------------------------------------


async def test_calls_beyond_the_burst_are_rejected_like_the_kubelet(plugin_dir: Path) -> None:
    """Past the burst, every method answers RESOURCE_EXHAUSTED "rejected by rate limit"; all count."""
    async with new_kubelet(plugin_dir, rate=(1.0, 3)) as kubelet, reader(kubelet) as pods:
        await pods.list()
        await pods.allocatable()
        await pods.list()
        for call in (pods.list(), pods.allocatable(), pods.get("ns", "a")):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call
            assert (raised.value.code(), raised.value.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "rejected by rate limit",
            )
        assert kubelet.pod_resources_calls == 6


@pytest.mark.parametrize("rate", [(100.0, 10), None], ids=["default", "unlimited"])
async def test_a_burst_of_calls_meets_the_default_limit(
    plugin_dir: Path, rate: tuple[float, int] | None
) -> None:
    """The default 100 qps / burst 10 rejects part of 50 calls at once; None rejects none."""
    async with new_kubelet(plugin_dir, rate) as kubelet, reader(kubelet) as pods:
        results = await asyncio.gather(*(pods.list() for _ in range(50)), return_exceptions=True)
        rejected = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        assert all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in rejected)
        if rate is None:
            assert rejected == []
        else:
            assert 10 <= 50 - len(rejected) < 50
        assert kubelet.pod_resources_calls == 50


def test_the_token_bucket_refills_at_the_rate() -> None:
    """rate.Limiter semantics: a full bucket of `burst`, then one token per 1/qps seconds."""
    now = [0.0]
    bucket = TokenBucket(10.0, 2, clock=lambda: now[0])
    assert [bucket.allow() for _ in range(3)] == [True, True, False]
    now[0] += 0.05
    assert not bucket.allow()
    now[0] += 0.05
    assert [bucket.allow(), bucket.allow()] == [True, False]
    now[0] += 10
    assert [bucket.allow() for _ in range(3)] == [True, True, False]

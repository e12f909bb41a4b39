"""devshim's v1beta1 plugin as a kubelet sees it: real servers, real unix sockets, the fake kubelet."""

from __future__ import annotations

import asyncio
import re
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from shim.compat.fakekubelet import CleanupMode, FakeKubelet, PluginSession
from shim.compat.fakekubelet.records import DeviceState, PluginOptions
from shim.model import Device, Health
from shim.sources import StaticSource
from tests.support.shim_fixtures import BAR, FOO, running_shim

GRANT = {
    "envs": {"FOO_DEVICES": "{ids}"},
    "mounts": [{"container_path": "/opt/foo", "host_path": "/opt/foo", "read_only": True}],
    "device_nodes": [{"container_path": "/dev/foo-{id}", "host_path": "/dev/null", "permissions": "rw"}],
    "annotations": {"example.com/owner": "devshim"},
    "cdi_devices": ["example.com/foo={id}"],
}
# With no policy of its own, a static resource may grant exactly what its grant holds.
FOUR = {"count": 4, "grant": GRANT}


def ids(devices: tuple[DeviceState, ...]) -> list[str]:
    return [d.id for d in devices]


@pytest.fixture
async def foo(plugin_dir: Path, kubelet: FakeKubelet) -> AsyncIterator[tuple[StaticSource, PluginSession]]:
    async with running_shim(plugin_dir, {FOO: FOUR}) as (_, sources):
        session = await kubelet.wait_for_plugin(FOO)
        await session.wait_for_list()
        yield sources[FOO], session


# --- registration ---------------------------------------------------------


async def test_registers_after_serving_with_upstream_fields(kubelet: FakeKubelet, foo: object) -> None:
    """Register carries v1beta1, the socket's file name and the resource, and succeeds only
    because devshim already serves: the fake kubelet dials the endpoint inside Register."""
    record = await kubelet.wait_for_registration(FOO)
    assert record.ok, record.error
    assert record.version == "v1beta1"
    assert re.fullmatch(r"devshim-example\.com_foo-[0-9a-f]{6}\.sock", record.endpoint), record.endpoint


async def test_register_request_carries_the_same_options_as_get_options(
    kubelet: FakeKubelet, foo: tuple[StaticSource, PluginSession]
) -> None:
    """Kubelets up to 1.24 read options from RegisterRequest; later ones ask; both must agree."""
    record = await kubelet.wait_for_registration(FOO)
    expected = PluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
    assert record.options == foo[1].options == expected


async def test_devshim_started_before_the_kubelet_registers_when_it_appears(plugin_dir: Path) -> None:
    """With no kubelet yet, devshim serves and retries; kubelet.sock appearing wakes it at once."""
    async with running_shim(plugin_dir, {FOO: FOUR}, register_backoff_max_s=30):
        await asyncio.sleep(0.3)
        async with FakeKubelet(plugin_dir) as kubelet:
            record = await kubelet.wait_for_registration(FOO, timeout=5)
            assert record.ok


# --- ListAndWatch ---------------------------------------------------------


async def test_the_full_list_arrives_at_once(foo: tuple[StaticSource, PluginSession]) -> None:
    """The first ListAndWatch message holds every device, all Healthy."""
    first = foo[1].lists[0]
    assert ids(first) == ["dev0", "dev1", "dev2", "dev3"]
    assert all(d.health == "Healthy" for d in first)


async def test_a_change_arrives_as_a_new_full_list(foo: tuple[StaticSource, PluginSession]) -> None:
    """An unhealthy device is sent as Unhealthy in a complete new list, never dropped."""
    source, session = foo
    await source.set_health("dev2", Health.UNHEALTHY)
    latest = await session.wait_for_list(lambda devices: not devices[2].healthy)
    assert ids(latest) == ["dev0", "dev1", "dev2", "dev3"]
    assert [d.health for d in latest] == ["Healthy", "Healthy", "Unhealthy", "Healthy"]


async def test_numa_nodes_reach_the_kubelet_as_topology(plugin_dir: Path, kubelet: FakeKubelet) -> None:
    """NUMA nodes from settings arrive as TopologyInfo; devices without them carry none."""
    devices = [{"id": "a", "numa_nodes": [0, 1]}, {"id": "b"}]
    async with running_shim(plugin_dir, {FOO: {"devices": devices}}):
        session = await kubelet.wait_for_plugin(FOO)
        listed = await session.wait_for_list()
    assert listed == (DeviceState("a", "Healthy", (0, 1)), DeviceState("b", "Healthy", ()))


# --- Allocate -------------------------------------------------------------


async def test_allocate_returns_the_configured_grant(foo: tuple[StaticSource, PluginSession]) -> None:
    """envs, mounts, device nodes, annotations and CDI names reach the kubelet for the right IDs."""
    grant = await foo[1].allocate(["dev1", "dev3"])
    assert grant.envs == {"FOO_DEVICES": "dev1,dev3"}
    assert grant.mounts == (("/opt/foo", "/opt/foo", True),)
    assert grant.device_nodes == (
        ("/dev/foo-dev1", "/dev/null", "rw"),
        ("/dev/foo-dev3", "/dev/null", "rw"),
    )
    assert grant.annotations == {"example.com/owner": "devshim"}
    assert grant.cdi_devices == ("example.com/foo=dev1", "example.com/foo=dev3")


async def test_allocate_answers_one_response_per_container(foo: tuple[StaticSource, PluginSession]) -> None:
    """Three container requests in one call get three responses, in order."""
    grants = await foo[1].allocate_containers([["dev0"], ["dev1", "dev2"], ["dev3"]])
    assert [g.envs["FOO_DEVICES"] for g in grants] == ["dev0", "dev1,dev2", "dev3"]


@pytest.mark.parametrize(
    ("requested", "fragment"),
    [
        pytest.param(["dev0", "ghost"], "unknown device ID 'ghost'", id="unknown"),
        pytest.param(["dev1"], "device 'dev1' is Unhealthy", id="unhealthy"),
    ],
)
async def test_allocate_of_an_unusable_device_is_invalid_argument_naming_it(
    foo: tuple[StaticSource, PluginSession], requested: list[str], fragment: str
) -> None:
    """An unknown or Unhealthy ID fails Allocate with INVALID_ARGUMENT naming the ID; the plugin
    keeps serving the next request."""
    source, session = foo
    await source.set_health("dev1", Health.UNHEALTHY)
    await session.wait_for_list(lambda devices: not devices[1].healthy)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await session.allocate(requested)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in (info.value.details() or "")
    assert (await session.allocate(["dev2"])).envs == {"FOO_DEVICES": "dev2"}


# --- GetPreferredAllocation -----------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4])
async def test_preferred_allocation_has_exactly_the_size_and_every_must_include(
    foo: tuple[StaticSource, PluginSession], size: int
) -> None:
    """The answer holds allocation_size IDs, each available, the must-include one among them."""
    chosen = await foo[1].preferred_allocation(["dev0", "dev1", "dev2", "dev3"], ["dev3"], size)
    assert len(chosen) == len(set(chosen)) == size
    assert "dev3" in chosen
    assert set(chosen) <= {"dev0", "dev1", "dev2", "dev3"}


async def test_an_impossible_preferred_allocation_is_invalid_argument(
    foo: tuple[StaticSource, PluginSession],
) -> None:
    """Asking for more devices than available is refused clearly instead of answered short."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await foo[1].preferred_allocation(["dev0"], [], 2)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_pod_admission_uses_preferred_allocation_then_allocate(
    foo: tuple[StaticSource, PluginSession],
) -> None:
    """The kubelet's admission path (preferred, then Allocate) hands out distinct devices."""
    first, _ = await foo[1].admit(2)
    second, grant = await foo[1].admit(2)
    assert not set(first) & set(second)
    assert grant.envs["FOO_DEVICES"] == ",".join(second)


# --- PreStartContainer ----------------------------------------------------


async def test_prestart_is_offered_and_answered_when_configured(
    plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    """pre_start: true sets pre_start_required; admission then calls PreStartContainer, which answers."""
    async with running_shim(plugin_dir, {FOO: {"count": 2, "pre_start": True}}):
        session = await kubelet.wait_for_plugin(FOO)
        await session.wait_for_list()
        assert session.options.pre_start_required
        async with asyncio.timeout(5):
            chosen, _ = await session.admit(1)
        await session.prestart(chosen)


async def test_prestart_is_not_required_by_default(foo: tuple[StaticSource, PluginSession]) -> None:
    """Without pre_start the option is off, so the kubelet never calls PreStartContainer."""
    assert not foo[1].options.pre_start_required


# --- several resources ----------------------------------------------------


async def test_two_resources_get_their_own_socket_registration_and_list(
    plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    """Each resource is served on its own socket, registered on its own, with its own devices."""
    async with running_shim(plugin_dir, {FOO: {"count": 2}, BAR: {"count": 3, "id_prefix": "bar"}}):
        foo_session = await kubelet.wait_for_plugin(FOO)
        bar_session = await kubelet.wait_for_plugin(BAR)
        assert ids(await foo_session.wait_for_list()) == ["dev0", "dev1"]
        assert ids(await bar_session.wait_for_list()) == ["bar0", "bar1", "bar2"]
        assert foo_session.endpoint != bar_session.endpoint
        assert (await bar_session.allocate(["bar2"])).envs == {}
        with pytest.raises(grpc.aio.AioRpcError, match="unknown device ID 'bar0'"):
            await foo_session.allocate(["bar0"])


# --- kubelet restarts -----------------------------------------------------


@pytest.mark.parametrize("cleanup", [CleanupMode.KUBELET_1_25, CleanupMode.KUBELET_1_33])
async def test_twenty_kubelet_restarts_lose_no_device(
    plugin_dir: Path, kubelet: FakeKubelet, cleanup: CleanupMode
) -> None:
    """After each of 20 restarts (with that kubelet version's cleanup) devshim registers again and
    every list received afterwards holds every device."""
    async with running_shim(plugin_dir, {FOO: {"count": 4}, BAR: {"count": 2, "id_prefix": "bar"}}):
        for resource in (FOO, BAR):
            await kubelet.wait_for_registration(resource)
        for restart in range(1, 21):
            await kubelet.restart(cleanup)
            for resource, expected in ((FOO, 4), (BAR, 2)):
                await kubelet.wait_for_registration(resource, count=restart + 1)
                session = await kubelet.wait_for_plugin(resource)
                listed = await session.wait_for_list()
                assert len(listed) == expected, f"restart {restart}: {resource} listed {ids(listed)}"
        for resource in (FOO, BAR):
            assert all(
                len(devices) == (4 if resource == FOO else 2) for devices in kubelet.plugin(resource).lists
            )


async def test_the_kubelet_ending_list_and_watch_triggers_re_registration(
    kubelet: FakeKubelet, foo: tuple[StaticSource, PluginSession]
) -> None:
    """A stream ended by the kubelet (not by devshim) means devshim was dropped: register again."""
    await foo[1].close()
    record = await kubelet.wait_for_registration(FOO, count=2)
    assert record.ok
    session = await kubelet.wait_for_plugin(FOO)
    assert len(await session.wait_for_list()) == 4


async def test_a_deleted_socket_is_re_created_and_re_registered(
    plugin_dir: Path, kubelet: FakeKubelet, foo: tuple[StaticSource, PluginSession]
) -> None:
    """Deleting the plugin socket (what a restarting kubelet does) makes devshim serve anew and register."""
    path = plugin_dir / foo[1].endpoint
    path.unlink()
    await kubelet.wait_for_registration(FOO, count=2)
    assert path.exists()


async def test_polling_notices_a_restart_when_inotify_is_off(plugin_dir: Path, kubelet: FakeKubelet) -> None:
    """watch_mode: poll still re-registers after a kubelet restart."""
    async with running_shim(plugin_dir, {FOO: {"count": 1}}, watch_mode="poll", poll_interval_s=0.1):
        await kubelet.wait_for_registration(FOO)
        await kubelet.restart(CleanupMode.KUBELET_1_33)
        assert (await kubelet.wait_for_registration(FOO, count=2)).ok


# --- the socket itself ----------------------------------------------------


async def test_the_socket_is_owner_only_and_serves_health_and_reflection(
    plugin_dir: Path, foo: tuple[StaticSource, PluginSession]
) -> None:
    """0600 socket; grpc.health.v1 reports SERVING for the plugin service; reflection lists it."""
    path = plugin_dir / foo[1].endpoint
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        reply = await check(health_pb2.HealthCheckRequest(service="v1beta1.DevicePlugin"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        services = [s.name async for r in stream for s in r.list_services_response.service]
    assert "v1beta1.DevicePlugin" in services


async def test_another_plugins_socket_is_left_alone(plugin_dir: Path, kubelet: FakeKubelet) -> None:
    """devshim never removes a socket it did not create, at start, restart or shutdown."""
    import socket

    other = plugin_dir / "vendor-other.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(other))
        async with running_shim(plugin_dir, {FOO: {"count": 1}}):
            await kubelet.wait_for_registration(FOO)
        assert other.exists()
        assert not list(plugin_dir.glob("devshim-example.com_foo-*.sock"))


async def test_devshim_keeps_no_file_in_the_device_plugins_dir(
    plugin_dir: Path, foo: tuple[StaticSource, PluginSession]
) -> None:
    """Kubelets up to 1.32 delete every regular file there, so devshim keeps only its socket."""
    names = sorted(p.name for p in plugin_dir.iterdir())
    assert names == sorted([foo[1].endpoint, "kubelet.sock"])


async def test_device_list_change_under_many_watch_cycles_keeps_latest(
    foo: tuple[StaticSource, PluginSession],
) -> None:
    """A burst of changes ends with the kubelet holding the newest list."""
    source, session = foo
    for n in range(1, 30):
        await source.set_devices([Device(f"dev{i}") for i in range(n)])
    latest = await session.wait_for_list(lambda devices: len(devices) == 29)
    assert ids(latest) == [f"dev{i}" for i in range(29)]

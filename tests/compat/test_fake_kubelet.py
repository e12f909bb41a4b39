"""Tests of the fake kubelet itself, against a scripted v1beta1 test-double plugin."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from shim.compat.fakekubelet import (
    CHECKPOINT_FILE,
    AdmissionRejected,
    CleanupMode,
    DeviceState,
    EndpointStopped,
    FakeKubelet,
    Grant,
    PluginOptions,
    ProtocolViolation,
)
from shim.compat.fakekubelet.dirs import clean_plugin_dir
from shim.compat.fakekubelet.names import is_extended_resource_name
from shim.compat.fakekubelet.profiles import DEPRECATION_FILE
from shim.compat.fakekubelet.records import RegisterRequest
from tests.support.scripted import PluginScript, ScriptedFailure
from tests.support.scripted_plugin import ScriptedPlugin
from tests.support.waiting import until

RESOURCE = "example.com/widget"
FOUR = tuple(DeviceState(f"w{i}", "Healthy") for i in range(4))
ALL_OPTIONS = PluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[FakeKubelet]:
    """tests/conftest.py's kubelet, with short dial and call timeouts: some tests here wait them out."""
    async with FakeKubelet(plugin_dir, dial_timeout_s=0.5, rpc_timeout_s=2.0) as kubelet:
        yield kubelet


def make_plugin(
    kubelet: FakeKubelet, *, options: PluginOptions | None = None, devices: tuple[DeviceState, ...] = FOUR
) -> ScriptedPlugin:
    return ScriptedPlugin(kubelet.plugin_dir / "p.sock", PluginScript(options=options, devices=devices))


@pytest.fixture
async def plugin(kubelet: FakeKubelet) -> AsyncIterator[ScriptedPlugin]:
    async with make_plugin(kubelet) as plugin:
        yield plugin


async def register(kubelet: FakeKubelet, plugin: ScriptedPlugin, resource: str = RESOURCE) -> None:
    await plugin.register(kubelet.kubelet_socket, resource)


def bind_socket(path: Path) -> None:
    """Leave a unix socket file at `path`, as another program's listener would."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))


# -- registration -------------------------------------------------------------------------------------


async def test_registration_is_recorded_with_what_the_plugin_sent(kubelet: FakeKubelet) -> None:
    """A successful Register is recorded with its fields, the arrival time and no error."""
    async with make_plugin(kubelet, options=ALL_OPTIONS) as plugin:
        before = time.monotonic()
        await register(kubelet, plugin)
        record = await kubelet.wait_for_registration(RESOURCE)
    assert record.ok and record.error is None
    assert (record.resource_name, record.endpoint, record.version) == (RESOURCE, "p.sock", "v1beta1")
    assert record.options == ALL_OPTIONS
    assert before <= record.received_at <= time.monotonic()


async def test_registration_opens_a_session_with_the_options_from_get_device_plugin_options(
    kubelet: FakeKubelet,
) -> None:
    """The session's options come from GetDevicePluginOptions, asked inside Register."""
    async with make_plugin(kubelet, options=ALL_OPTIONS) as plugin:
        await register(kubelet, plugin)
        session = kubelet.plugin(RESOURCE)
        assert (session.resource, session.endpoint, session.options) == (RESOURCE, "p.sock", ALL_OPTIONS)
        assert await session.wait_for_list() == FOUR


async def test_register_fails_when_the_plugin_is_not_serving(kubelet: FakeKubelet) -> None:
    """Since 1.25 the kubelet dials inside Register, so registering before serving fails."""
    plugin = make_plugin(kubelet)  # never started
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await register(kubelet, plugin)
    assert raised.value.code() == grpc.StatusCode.UNKNOWN
    assert "failed to dial device plugin" in (raised.value.details() or "")
    (record,) = kubelet.registrations
    assert not record.ok and "failed to dial" in (record.error or "")
    with pytest.raises(KeyError, match="no plugin registered"):
        kubelet.plugin(RESOURCE)


@pytest.mark.parametrize(
    ("version", "resource", "message"),
    [
        pytest.param("v1alpha", RESOURCE, 'requested API version "v1alpha" is not supported', id="version"),
        pytest.param("v1beta1", "widget", 'the ResourceName "widget" is invalid', id="no-domain"),
        pytest.param("v1beta1", "kubernetes.io/gpu", "is invalid", id="kubernetes.io"),
    ],
)
async def test_register_rejects_bad_versions_and_resource_names(
    kubelet: FakeKubelet, plugin: ScriptedPlugin, version: str, resource: str, message: str
) -> None:
    """server.go Register refuses an unsupported version or a non-extended resource name."""
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await plugin.register(kubelet.kubelet_socket, resource, version=version)
    assert raised.value.code() == grpc.StatusCode.UNKNOWN
    assert message in (raised.value.details() or "")
    assert [r.error is not None and message in r.error for r in kubelet.registrations] == [True]
    assert plugin.script.streams_opened == 0


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("example.com/widget", True),
        ("nvidia.com/gpu", True),
        ("a.b-c.example/x_y.z", True),
        ("widget", False),
        ("kubernetes.io/widget", False),
        ("sub.kubernetes.io/widget", False),
        ("requests.example.com/widget", False),
        ("example.com/", False),
        ("/widget", False),
        ("Example.com/widget", False),
        ("example.com/a/b", False),
        ("example.com/-widget", False),
        ("example.com/" + "w" * 64, False),
    ],
)
def test_extended_resource_names_follow_the_kubelet(name: str, valid: bool) -> None:
    """is_extended_resource_name agrees with helpers.go IsExtendedResourceName."""
    assert is_extended_resource_name(name) is valid


async def test_reregistering_replaces_the_session_and_ends_the_old_stream(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """A second Register for a resource replaces its session; the old stream ends."""
    await register(kubelet, plugin)
    first = kubelet.plugin(RESOURCE)
    await register(kubelet, plugin)
    await kubelet.wait_for_registration(RESOURCE, count=2)
    second = kubelet.plugin(RESOURCE)
    assert second is not first
    async with asyncio.timeout(5):
        await first.stream_ended.wait()
    assert await second.wait_for_list() == FOUR


async def test_stopping_during_register_records_an_interrupted_registration(plugin_dir: Path) -> None:
    """A Register still dialing when the kubelet stops fails, is recorded, and leaks nothing."""
    arrived = asyncio.Event()

    async def note_arrival(request: RegisterRequest, received_at: float) -> None:
        arrived.set()

    # A dial that cannot time out while the test runs: the stop, not the timeout, ends it.
    async with FakeKubelet(plugin_dir, dial_timeout_s=60, on_register=note_arrival) as kubelet:
        plugin = make_plugin(kubelet)  # never started: the kubelet keeps dialing
        attempt = asyncio.create_task(register(kubelet, plugin))
        async with asyncio.timeout(30):
            await arrived.wait()  # the Register is in, its dial about to start
        await kubelet.stop()
        with pytest.raises(grpc.aio.AioRpcError):
            await attempt
        await until(lambda: bool(kubelet.registrations), "the interrupted Register is recorded")
        (record,) = kubelet.registrations
        assert record.error == "interrupted: the kubelet stopped during Register"


async def test_waiting_for_a_registration_that_never_comes_times_out_with_context(
    kubelet: FakeKubelet,
) -> None:
    """wait_for_registration says what it waited for and what it saw."""
    with pytest.raises(TimeoutError, match="registrations of 'example.com/widget'"):
        await kubelet.wait_for_registration(RESOURCE, timeout=0.1)


# -- ListAndWatch -------------------------------------------------------------------------------------


async def test_every_list_is_recorded_in_order(kubelet: FakeKubelet, plugin: ScriptedPlugin) -> None:
    """Each ListAndWatch message becomes one entry of session.lists, topology included."""
    await register(kubelet, plugin)
    session = kubelet.plugin(RESOURCE)
    await session.wait_for_list()
    sick = (DeviceState("w0", "Unhealthy", (0,)), DeviceState("w1", "Healthy", (0, 1)))
    plugin.script.push(sick)
    plugin.script.push(FOUR[:1])
    assert await session.wait_for_list(lambda devices: len(devices) == 1) == FOUR[:1]
    assert session.lists == [FOUR, sick, FOUR[:1]]
    assert session.latest == FOUR[:1]


async def test_wait_for_list_returns_the_newest_list_when_it_matches(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """A list that already arrived satisfies wait_for_list without waiting."""
    await register(kubelet, plugin)
    session = kubelet.plugin(RESOURCE)
    await session.wait_for_list()
    assert await session.wait_for_list(lambda devices: len(devices) == 4, timeout=0.1) == FOUR


async def test_stream_ends_when_the_plugin_server_stops(kubelet: FakeKubelet, plugin: ScriptedPlugin) -> None:
    """The session notices a vanished plugin; the kubelet then stops calling it."""
    await register(kubelet, plugin)
    session = kubelet.plugin(RESOURCE)
    await session.wait_for_list()
    await plugin.stop()
    async with asyncio.timeout(5):
        await session.stream_ended.wait()
    assert session.stream_error is not None and "UNAVAILABLE" in session.stream_error
    with pytest.raises(EndpointStopped):
        await session.allocate(["w0"])
    with pytest.raises(EndpointStopped):
        await session.wait_for_list(lambda devices: False)
    assert kubelet.plugin(RESOURCE) is session  # the kubelet keeps the stopped endpoint


async def test_wait_for_list_times_out_with_context(kubelet: FakeKubelet, plugin: ScriptedPlugin) -> None:
    """A list that never comes ends in a TimeoutError naming the resource."""
    await register(kubelet, plugin)
    with pytest.raises(TimeoutError, match="example.com/widget: no matching list"):
        await kubelet.plugin(RESOURCE).wait_for_list(lambda devices: len(devices) == 9, timeout=0.1)


async def test_stream_error_records_the_status_the_plugin_ended_with(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """A plugin that fails its stream leaves the status code and details in stream_error."""
    await register(kubelet, plugin)
    session = kubelet.plugin(RESOURCE)
    await session.wait_for_list()
    plugin.script.end_streams(ScriptedFailure(grpc.StatusCode.INTERNAL, "boom"))
    async with asyncio.timeout(5):
        await session.stream_ended.wait()
    assert session.stream_error == "INTERNAL: boom"


async def test_stopping_the_kubelet_ends_every_plugin_stream(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """stop() closes the channels, which ends the plugins' ListAndWatch streams."""
    await register(kubelet, plugin)
    session = kubelet.plugin(RESOURCE)
    await session.wait_for_list()
    assert plugin.script.open_streams == 1
    await kubelet.stop()
    assert session.stream_ended.is_set() and session.stream_error == "closed by the kubelet"
    for _ in range(50):
        if plugin.script.open_streams == 0:
            break
        await asyncio.sleep(0.02)
    assert plugin.script.open_streams == 0
    assert not kubelet.kubelet_socket.exists()


# -- restart ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "kept"),
    [
        pytest.param(CleanupMode.KUBELET_1_25, {CHECKPOINT_FILE, "subdir"}, id="1.25"),
        pytest.param(CleanupMode.KUBELET_1_33, {CHECKPOINT_FILE, "subdir", "notes.txt"}, id="1.33"),
    ],
)
async def test_restart_cleans_like_the_release_and_recreates_kubelet_sock(
    kubelet: FakeKubelet, plugin: ScriptedPlugin, mode: CleanupMode, kept: set[str]
) -> None:
    """1.25-1.32 remove every non-directory but the checkpoint; 1.33+ remove only sockets."""
    directory = kubelet.plugin_dir
    (directory / "notes.txt").write_text("x")
    (directory / "subdir").mkdir()
    (directory / "subdir" / "inner.sock").write_text("not touched: cleanup is not recursive")
    (directory / CHECKPOINT_FILE).write_text("{}")
    bind_socket(directory / "foreign.sock")
    await register(kubelet, plugin)
    session = kubelet.plugin(RESOURCE)

    before = time.monotonic()
    created_at = await kubelet.restart(mode)

    assert before <= created_at <= time.monotonic() and kubelet.restarts == [created_at]
    # A 1.24 start re-creates DEPRECATION after the cleanup; later ones never make it.
    made = {DEPRECATION_FILE} if kubelet.profile.deprecation_file else set()
    assert set(os.listdir(directory)) == kept | {"kubelet.sock"} | made
    assert os.listdir(directory / "subdir") == ["inner.sock"]
    assert stat.S_ISSOCK(kubelet.kubelet_socket.stat().st_mode)
    assert session.stream_ended.is_set()
    with pytest.raises(KeyError):
        kubelet.plugin(RESOURCE)


async def test_a_plugin_can_register_again_after_a_restart(kubelet: FakeKubelet) -> None:
    """After a restart the new kubelet accepts the plugin's second registration."""
    async with make_plugin(kubelet) as plugin:
        await register(kubelet, plugin)
        await kubelet.restart(CleanupMode.KUBELET_1_33)
        await plugin.stop()  # its socket is gone: serve again, then register again
        await plugin.start()
        await register(kubelet, plugin)
        record = await kubelet.wait_for_registration(RESOURCE, count=2)
        assert record.received_at > kubelet.restarts[-1]
        assert await (await kubelet.wait_for_plugin(RESOURCE)).wait_for_list() == FOUR


@pytest.mark.parametrize(
    ("mode", "kept"),
    [
        pytest.param(CleanupMode.KUBELET_1_25, {"dir"}, id="1.25"),
        pytest.param(CleanupMode.KUBELET_1_33, {"dir", "file", "to-dir", "to-file", "dangle"}, id="1.33"),
    ],
)
def test_cleanup_treats_symlinks_like_the_release(
    plugin_dir: Path, mode: CleanupMode, kept: set[str]
) -> None:
    """1.25 judges entries by lstat (links go); 1.33 by stat (only links to sockets go)."""
    (plugin_dir / "dir").mkdir()
    (plugin_dir / "file").write_text("x")
    bind_socket(plugin_dir / "sock")
    bind_socket(plugin_dir / "dir" / "inner.sock")  # a link target that the cleanup itself leaves
    links = {"to-dir": "dir", "to-file": "file", "to-sock": "dir/inner.sock", "dangle": "gone"}
    for name, target in links.items():
        (plugin_dir / name).symlink_to(plugin_dir / target)
    removed = clean_plugin_dir(plugin_dir, mode)
    assert set(os.listdir(plugin_dir)) == kept
    assert set(removed) == {"dir", "file", "sock", *links} - kept


# -- calls and admission -----------------------------------------------------------------------------


async def test_allocate_translates_every_field_of_the_grant(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """Envs, mounts, device nodes, annotations and CDI devices survive the wire."""
    grant = Grant(
        envs={"A": "1"},
        mounts=(("/c", "/h", True),),
        device_nodes=(("/dev/w0", "/dev/w0", "rw"),),
        annotations={"k": "v"},
        cdi_devices=("example.com/widget=w0",),
    )
    plugin.script.allocate_reply = lambda containers: [grant]
    await register(kubelet, plugin)
    assert await kubelet.plugin(RESOURCE).allocate(["w0"]) == grant
    assert plugin.script.allocate_calls == [[("w0",)]]


async def test_allocate_checks_one_response_per_container_request(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """A response count that differs from the request count is a protocol violation."""
    plugin.script.allocate_reply = lambda containers: [Grant()]
    await register(kubelet, plugin)
    with pytest.raises(ProtocolViolation, match="2 container requests got 1"):
        await kubelet.plugin(RESOURCE).allocate_containers([["w0"], ["w1"]])


async def test_rpc_errors_propagate_with_their_status(kubelet: FakeKubelet, plugin: ScriptedPlugin) -> None:
    """A failing Allocate reaches the test as AioRpcError with the plugin's code and details."""

    def refuse(containers: object) -> list[Grant]:
        raise ScriptedFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, "no widgets")

    plugin.script.allocate_reply = refuse
    await register(kubelet, plugin)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await kubelet.plugin(RESOURCE).allocate(["w0"])
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "no widgets")


async def test_optional_calls_are_refused_when_the_options_do_not_offer_them(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """The kubelet never calls GetPreferredAllocation or PreStartContainer unless offered."""
    await register(kubelet, plugin)
    session = kubelet.plugin(RESOURCE)
    with pytest.raises(ProtocolViolation):
        await session.preferred_allocation(["w0", "w1"], [], 1)
    with pytest.raises(ProtocolViolation):
        await session.prestart(["w0"])
    assert plugin.script.preferred_calls == [] and plugin.script.prestart_calls == []


async def test_admit_takes_healthy_free_devices_in_list_order(kubelet: FakeKubelet) -> None:
    """Without optional calls, admit allocates the first healthy devices not in use."""
    devices = (DeviceState("w0", "Unhealthy"), *FOUR[1:])
    async with make_plugin(kubelet, devices=devices) as plugin:
        await register(kubelet, plugin)
        session = kubelet.plugin(RESOURCE)
        await session.wait_for_list()
        ids, grant = await session.admit(2)
        assert ids == ["w1", "w2"] and grant == Grant(envs={"DEVICES": "w1,w2"})
        with pytest.raises(AdmissionRejected, match="Requested: 2, Available: 1"):
            await session.admit(2)
        session.release(ids)
        assert (await session.admit(3))[0] == ["w1", "w2", "w3"]
        assert session.in_use == {"w1", "w2", "w3"}


async def test_admit_uses_the_preferred_allocation_and_calls_prestart(kubelet: FakeKubelet) -> None:
    """With both options, admit asks GetPreferredAllocation, allocates that, then pre-starts."""
    async with make_plugin(kubelet, options=ALL_OPTIONS) as plugin:
        await register(kubelet, plugin)
        session = kubelet.plugin(RESOURCE)
        await session.wait_for_list()
        ids, _ = await session.admit(2)
        assert ids == ["w3", "w2"]
        (request,) = plugin.script.preferred_calls[0]
        assert (request.available, request.must_include, request.size) == (("w0", "w1", "w2", "w3"), (), 2)
        assert plugin.script.allocate_calls == [[("w3", "w2")]]
        assert plugin.script.prestart_calls == [("w3", "w2")]


async def test_admit_ignores_preferred_ids_that_are_not_available(kubelet: FakeKubelet) -> None:
    """Preferred ids outside the available set are dropped; the rest fill up in list order."""
    async with make_plugin(kubelet, options=ALL_OPTIONS) as plugin:
        plugin.script.preferred_reply = lambda request: ["nope", "w2"]
        await register(kubelet, plugin)
        session = kubelet.plugin(RESOURCE)
        await session.wait_for_list()
        assert (await session.admit(2))[0] == ["w2", "w0"]


async def test_a_failed_allocate_frees_the_devices_again(
    kubelet: FakeKubelet, plugin: ScriptedPlugin
) -> None:
    """manager.go restores the allocated set when Allocate fails."""

    def refuse(containers: object) -> list[Grant]:
        raise ScriptedFailure(grpc.StatusCode.INTERNAL, "broken")

    plugin.script.allocate_reply = refuse
    await register(kubelet, plugin)
    session = kubelet.plugin(RESOURCE)
    await session.wait_for_list()
    with pytest.raises(grpc.aio.AioRpcError):
        await session.admit(1)
    assert session.in_use == frozenset()

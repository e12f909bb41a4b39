"""Tests of the fake kubelet's plugin watcher path, against scripted test-double plugins.

A plugin serves pluginregistration.Registration (and, usually, its DevicePlugin) on a socket in
plugins_registry; the kubelet finds it, asks GetInfo, connects and notifies the outcome.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from shim.compat.fakekubelet import (
    CLASSIC,
    WATCHER,
    CleanupMode,
    DeviceState,
    FakeKubelet,
    Notification,
    PluginInfo,
    PluginSession,
    WatchMode,
)
from tests.support.scripted import PluginScript, RegistrationScript, ScriptedFailure
from tests.support.scripted_plugin import ScriptedPlugin

RESOURCE = "example.com/widget"
FOUR = tuple(DeviceState(f"w{i}", "Healthy") for i in range(4))
INFO = PluginInfo("DevicePlugin", RESOURCE, "", ("v1beta1",))


def new_kubelet(root: Path, mode: WatchMode = "auto") -> FakeKubelet:
    return FakeKubelet(
        root / "device-plugins",
        dial_timeout_s=0.5,
        rpc_timeout_s=2.0,
        plugins_registry=root / "plugins_registry",
        watch_mode=mode,
    )


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[FakeKubelet]:
    """Instead of tests/conftest.py's: new_kubelet's, watching plugins_registry/ beside device-plugins/."""
    async with new_kubelet(plugin_dir) as kubelet:
        yield kubelet


def registry(kubelet: FakeKubelet) -> Path:
    assert kubelet.plugins_registry is not None
    return kubelet.plugins_registry


def watched(kubelet: FakeKubelet, info: PluginInfo = INFO, name: str = "widget.sock") -> ScriptedPlugin:
    """A plugin whose registration socket (also serving its DevicePlugin) is in plugins_registry."""
    script = PluginScript(devices=FOUR)
    return ScriptedPlugin(registry(kubelet) / name, script, registration=RegistrationScript(info))


def script_of(plugin: ScriptedPlugin) -> RegistrationScript:
    assert plugin.registration is not None
    return plugin.registration


async def wait_ended(session: PluginSession) -> None:
    async with asyncio.timeout(5):
        await session.stream_ended.wait()


# -- registration ------------------------------------------------------------------------------------


async def test_a_socket_appearing_after_start_is_registered_and_notified(kubelet: FakeKubelet) -> None:
    """GetInfo, then the DevicePlugin on the same socket, then NotifyRegistrationStatus(True)."""
    async with watched(kubelet) as plugin:
        record = await kubelet.wait_for_registration(RESOURCE)
        session = kubelet.plugin(RESOURCE)
        assert await session.wait_for_list() == FOUR
        assert await script_of(plugin).wait_for_notifications() == [(True, "")]
    sock = str(plugin.socket_path)
    assert (record.path, record.socket, record.endpoint, record.version) == (WATCHER, sock, sock, "v1beta1")
    assert record.options is None and session.endpoint == sock
    assert kubelet.notifications == [Notification("widget.sock", True, "")]
    assert script_of(plugin).info_calls == 1


async def test_a_socket_present_before_start_is_found_by_the_walk(plugin_dir: Path) -> None:
    """On start the watcher walks the directory (creating it) before it watches."""
    (plugin_dir / "plugins_registry" / "sub").mkdir(parents=True)
    kubelet = new_kubelet(plugin_dir)
    async with watched(kubelet, name="sub/widget.sock"), kubelet:
        await kubelet.wait_for_registration(RESOURCE)
        assert kubelet.notifications == [Notification("sub/widget.sock", True, "")]


async def test_sockets_in_new_subdirectories_are_found(kubelet: FakeKubelet) -> None:
    """A directory created later is watched too (plugin_watcher.go traverses it)."""
    (registry(kubelet) / "later").mkdir()
    async with watched(kubelet, name="later/widget.sock"):
        await kubelet.wait_for_registration(RESOURCE)


async def test_hidden_and_non_socket_files_are_ignored(kubelet: FakeKubelet) -> None:
    """Names starting with '.' and files that are not sockets never reach GetInfo."""
    (registry(kubelet) / "notes.sock").write_text("not a socket")
    async with watched(kubelet, name=".hidden.sock") as hidden, watched(kubelet) as plugin:
        await script_of(plugin).wait_for_notifications()
        # The plugin hears of its registration before the kubelet has recorded it: wait for both.
        await kubelet.wait_for_registration(RESOURCE)
        assert script_of(hidden).info_calls == 0
    assert [r.socket for r in kubelet.registrations] == [str(plugin.socket_path)]


async def test_a_non_empty_endpoint_is_the_device_plugin_socket(
    plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    """GetInfo's endpoint, when set, is the path the kubelet dials for the DevicePlugin service."""
    device_plugin = ScriptedPlugin(plugin_dir / "dp.sock", PluginScript(devices=FOUR[:2]))
    info = PluginInfo("DevicePlugin", RESOURCE, str(device_plugin.socket_path), ("v1beta1",))
    async with device_plugin, watched(kubelet, info) as registration_only:
        record = await kubelet.wait_for_registration(RESOURCE)
        assert await kubelet.plugin(RESOURCE).wait_for_list() == FOUR[:2]
    assert record.endpoint == str(device_plugin.socket_path)
    assert (device_plugin.script.streams_opened, registration_only.script.streams_opened) == (1, 0)


def refused(kind: str, socket_path: Path) -> str:
    return {
        "type": "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin "
        f"at socket {socket_path}",
        "version": "RegisterPlugin error -- plugin validation failed with err: manager version, v1beta1, "
        "is not among plugin supported versions [v1alpha1 v1]",
        "name": "RegisterPlugin error -- plugin validation failed with err: invalid name of device plugin "
        'socket: the ResourceName "widget" is invalid',
        "kubernetes.io": "RegisterPlugin error -- plugin validation failed with err: invalid name of device "
        'plugin socket: the ResourceName "kubernetes.io/widget" is invalid',
    }[kind]


@pytest.mark.parametrize(
    ("kind", "info"),
    [
        pytest.param("type", PluginInfo("CSIPlugin", RESOURCE, "", ("v1beta1",)), id="type"),
        pytest.param("version", PluginInfo("DevicePlugin", RESOURCE, "", ("v1alpha1", "v1")), id="version"),
        pytest.param("name", PluginInfo("DevicePlugin", "widget", "", ("v1beta1",)), id="name"),
        pytest.param("kubernetes.io", PluginInfo("DevicePlugin", "kubernetes.io/widget", "", ("v1beta1",))),
    ],
)
async def test_an_invalid_plugin_is_told_why_in_the_kubelets_words(
    kubelet: FakeKubelet, kind: str, info: PluginInfo
) -> None:
    """No handler or failed validation: NotifyRegistrationStatus(False, <upstream message>)."""
    async with watched(kubelet, info) as plugin:
        (first, *_) = await script_of(plugin).wait_for_notifications()
        await kubelet.wait_until(lambda: bool(kubelet.registrations))
    message = refused(kind, plugin.socket_path)
    assert first == (False, message)
    assert kubelet.notifications[0] == Notification("widget.sock", False, message)
    assert kubelet.registrations[0].error == message and kubelet.registrations[0].path == WATCHER
    assert plugin.script.streams_opened == 0


async def test_a_refused_plugin_is_retried_with_backoff(kubelet: FakeKubelet) -> None:
    """The operation executor retries a failed registration (after 0.5 s, then longer)."""
    info = PluginInfo("DevicePlugin", "widget", "", ("v1beta1",))
    async with watched(kubelet, info) as plugin:
        first, second = (await script_of(plugin).wait_for_notifications(2, timeout=5))[:2]
        assert first == second and not first[0]
        script_of(plugin).info = INFO  # fixed: the next retry succeeds
        await kubelet.wait_for_registration(RESOURCE, timeout=5)


async def test_a_failed_get_info_is_recorded_without_a_notification(kubelet: FakeKubelet) -> None:
    """operation_generator.go returns a failed GetInfo without notifying the plugin."""
    async with watched(kubelet) as plugin:
        script_of(plugin).info_failure = ScriptedFailure(grpc.StatusCode.UNIMPLEMENTED, "no info")
        await kubelet.wait_until(lambda: bool(kubelet.registrations))
    (record,) = kubelet.registrations[:1]
    assert record.error == (
        "RegisterPlugin error -- failed to get plugin info using RPC GetInfo "
        f"at socket {plugin.socket_path}, err: rpc error: code = Unimplemented desc = no info"
    )
    assert kubelet.notifications == []


async def test_an_unreachable_endpoint_fails_registration(plugin_dir: Path, kubelet: FakeKubelet) -> None:
    """RegisterPlugin fails to dial the DevicePlugin: the plugin is told, with the dial error."""
    info = PluginInfo("DevicePlugin", RESOURCE, str(plugin_dir / "nobody.sock"), ("v1beta1",))
    async with watched(kubelet, info) as plugin:
        (first, *_) = await script_of(plugin).wait_for_notifications()
    assert first == (
        False,
        "RegisterPlugin error -- plugin registration failed with err: "
        "failed to dial device plugin: context deadline exceeded",
    )


# -- deregistration, re-creation, restart -----------------------------------------------------------


async def test_removing_the_socket_deregisters_the_plugin(kubelet: FakeKubelet) -> None:
    """DeRegisterPlugin disconnects the client: the stream ends, the stopped endpoint stays."""
    async with watched(kubelet) as plugin:
        session = await kubelet.wait_for_plugin(RESOURCE)
        await session.wait_for_list()
        os.unlink(plugin.socket_path)  # the server keeps running: only the kubelet acts
        await wait_ended(session)
        assert session.stream_error == "closed by the kubelet"
        assert kubelet.plugin(RESOURCE) is session


async def test_a_plugin_that_restarts_is_registered_again(kubelet: FakeKubelet) -> None:
    """A re-created socket is unregistered, then registered again."""
    async with watched(kubelet) as plugin:
        first = await kubelet.wait_for_plugin(RESOURCE)
        await script_of(plugin).wait_for_notifications()
        await plugin.stop()
        await plugin.start()
        await kubelet.wait_for_registration(RESOURCE, count=2)
        await wait_ended(first)
        assert kubelet.plugin(RESOURCE) is not first
        assert await kubelet.plugin(RESOURCE).wait_for_list() == FOUR
        assert await script_of(plugin).wait_for_notifications(2) == [(True, ""), (True, "")]


async def test_a_restarted_kubelet_finds_the_plugin_again(kubelet: FakeKubelet) -> None:
    """plugins_registry survives the restart; the new kubelet walks it and reconnects."""
    async with watched(kubelet) as plugin:
        first = await kubelet.wait_for_plugin(RESOURCE)
        await first.wait_for_list()
        await script_of(plugin).wait_for_notifications()
        await kubelet.restart(CleanupMode.KUBELET_1_25)
        assert plugin.socket_path.exists() and first.stream_ended.is_set()
        record = await kubelet.wait_for_registration(RESOURCE, count=2)
        assert record.received_at > kubelet.restarts[-1]
        assert await kubelet.plugin(RESOURCE).wait_for_list() == FOUR
        assert await script_of(plugin).wait_for_notifications(2) == [(True, ""), (True, "")]
        assert plugin.script.streams_opened == 2


async def test_classic_registrations_say_so(kubelet: FakeKubelet, plugin_dir: Path) -> None:
    """A Register call on kubelet.sock is recorded with path CLASSIC and no socket."""
    async with ScriptedPlugin(kubelet.plugin_dir / "p.sock", PluginScript(devices=FOUR)) as plugin:
        await plugin.register(kubelet.kubelet_socket, RESOURCE)
    assert (kubelet.registrations[0].path, kubelet.registrations[0].socket) == (CLASSIC, "")


async def test_polling_finds_and_forgets_sockets(plugin_dir: Path) -> None:
    """Without inotify the watcher polls once a second, with the same outcome."""
    async with new_kubelet(plugin_dir, "poll") as kubelet, watched(kubelet) as plugin:
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=5)
        await script_of(plugin).wait_for_notifications()  # the operation is over: only a poll sees
        os.unlink(plugin.socket_path)
        await wait_ended(session)

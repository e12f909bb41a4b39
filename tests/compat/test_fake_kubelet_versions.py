"""Tests of the fake kubelet's API versions: v1beta1, devshim's experimental v1beta2, or both.

Against scripted test-double plugins serving v1beta1 and/or v1beta2 and registering on a chosen
version's Registration service, or found by the plugin watcher.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from shim.compat.fakekubelet import (
    API_VERSIONS,
    CleanupMode,
    ContainerSpec,
    DeviceState,
    FakeKubelet,
    Grant,
    PluginInfo,
    PluginOptions,
    PluginSession,
    ProtocolViolation,
)
from tests.support.scripted import (
    PluginScript,
    RegistrationScript,
    ScriptedFailure,
    grant_per_container,
)
from tests.support.scripted_plugin import ScriptedPlugin

RESOURCE = "example.com/widget"
FOUR = tuple(DeviceState(f"w{i}", "Healthy") for i in range(4))
BOTH = ("v1beta1", "v1beta2")
V1BETA2_FLAGS = PluginOptions(deallocate_available=True, post_stop_container_required=True)
UNSUPPORTED = 'requested API version "{}" is not supported by kubelet. Supported version is ["{}"]'


def new_kubelet(root: Path, versions: Sequence[str], *, watcher: bool = False) -> FakeKubelet:
    return FakeKubelet(
        root / "device-plugins",
        dial_timeout_s=0.5,
        rpc_timeout_s=2.0,
        plugins_registry=root / "plugins_registry" if watcher else None,
        versions=versions,
    )


def make_plugin(
    kubelet: FakeKubelet, serves: Sequence[str] = BOTH, options: PluginOptions = V1BETA2_FLAGS
) -> ScriptedPlugin:
    script = PluginScript(options=options, devices=FOUR)
    return ScriptedPlugin(kubelet.plugin_dir / "p.sock", script, serves=serves)


async def negotiate(kubelet: FakeKubelet, plugin: ScriptedPlugin) -> str:
    """Register as devshim negotiates: on v1beta2 first, on v1beta1 when the kubelet has no v1beta2."""
    try:
        await plugin.register(kubelet.kubelet_socket, RESOURCE, on="v1beta2")
        return "v1beta2"
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise
    await plugin.register(kubelet.kubelet_socket, RESOURCE, on="v1beta1")
    return "v1beta1"


@pytest.fixture
async def both(plugin_dir: Path) -> AsyncIterator[FakeKubelet]:
    async with new_kubelet(plugin_dir, BOTH) as kubelet:
        yield kubelet


def test_versions_are_kept_newest_first_and_checked(plugin_dir: Path) -> None:
    assert API_VERSIONS == BOTH
    assert new_kubelet(plugin_dir, BOTH).versions == ("v1beta2", "v1beta1")
    assert new_kubelet(plugin_dir, ["v1beta1", "v1beta1"]).versions == ("v1beta1",)
    with pytest.raises(ValueError, match="unknown device plugin API versions"):
        new_kubelet(plugin_dir, ["v1"])
    with pytest.raises(ValueError, match="at least one"):
        new_kubelet(plugin_dir, [])


# -- the classic path ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("spoken", "other"), [("v1beta1", "v1beta2"), ("v1beta2", "v1beta1")])
async def test_a_version_the_kubelet_does_not_speak_has_no_registration_service(
    plugin_dir: Path, spoken: str, other: str
) -> None:
    """Register on the other version's service: UNIMPLEMENTED, as from a kubelet predating it."""
    async with new_kubelet(plugin_dir, [spoken]) as kubelet, make_plugin(kubelet) as plugin:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await plugin.register(kubelet.kubelet_socket, RESOURCE, on=other)
        assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert kubelet.registrations == []
        assert await negotiate(kubelet, plugin) == spoken


@pytest.mark.parametrize(("spoken", "other"), [("v1beta1", "v1beta2"), ("v1beta2", "v1beta1")])
async def test_a_service_refuses_another_version_with_the_upstream_message(
    plugin_dir: Path, spoken: str, other: str
) -> None:
    """server.go Register: errUnsupportedVersion, formatted with the service's SupportedVersions."""
    async with new_kubelet(plugin_dir, [spoken]) as kubelet, make_plugin(kubelet) as plugin:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await plugin.register(kubelet.kubelet_socket, RESOURCE, on=spoken, version=other)
        message = UNSUPPORTED.format(other, spoken)
        assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.UNKNOWN, message)
        (record,) = kubelet.registrations
        assert (record.version, record.error) == (other, message)
        assert plugin.script.streams_opened == 0


@pytest.mark.parametrize("version", BOTH)
async def test_a_kubelet_speaking_both_accepts_either_and_uses_that_version(
    both: FakeKubelet, version: str
) -> None:
    """The session speaks the Register's version; v1beta1 cannot carry the v1beta2 flags."""
    async with make_plugin(both) as plugin:
        await plugin.register(both.kubelet_socket, RESOURCE, on=version)
        record = await both.wait_for_registration(RESOURCE)
        session = both.plugin(RESOURCE)
        assert (record.version, session.version) == (version, version)
        expected = V1BETA2_FLAGS if version == "v1beta2" else PluginOptions()
        assert record.options == session.options == expected
        assert await session.wait_for_list() == FOUR
        ids, grant = await session.admit(2)
        assert grant.envs == {"DEVICES": ",".join(ids)}


async def test_a_v1beta2_register_for_a_v1beta1_only_plugin_fails_at_get_options(
    both: FakeKubelet,
) -> None:
    """The kubelet dials the version registered on; a plugin not serving it answers UNIMPLEMENTED."""
    async with make_plugin(both, serves=["v1beta1"]) as plugin:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await plugin.register(both.kubelet_socket, RESOURCE, on="v1beta2")
        expected = "failed to get device plugin options: rpc error: code = Unimplemented desc = "
        assert (raised.value.details() or "").startswith(expected)


# -- the plugin watcher path ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spoken", "offered", "chosen"),
    [
        pytest.param(BOTH, BOTH, "v1beta2", id="both-both"),
        pytest.param(BOTH, ("v1beta1",), "v1beta1", id="both-v1beta1"),
        pytest.param(("v1beta1",), ("v1beta2", "v1beta1"), "v1beta1", id="v1beta1-both"),
        pytest.param(("v1beta2",), ("v1alpha", "v1beta2"), "v1beta2", id="v1beta2-both"),
    ],
)
async def test_the_watcher_uses_the_newest_common_version(
    plugin_dir: Path, spoken: tuple[str, ...], offered: tuple[str, ...], chosen: str
) -> None:
    async with new_kubelet(plugin_dir, spoken, watcher=True) as kubelet, watched(kubelet, offered) as plugin:
        record = await kubelet.wait_for_registration(RESOURCE)
        session = kubelet.plugin(RESOURCE)
        assert (record.version, session.version) == (chosen, chosen)
        assert await session.wait_for_list() == FOUR
        assert await registration_of(plugin).wait_for_notifications() == [(True, "")]


async def test_the_watcher_refuses_a_plugin_without_a_common_version(plugin_dir: Path) -> None:
    """handler.go ValidatePlugin's message, naming the kubelet's newest version."""
    kubelet = new_kubelet(plugin_dir, BOTH, watcher=True)
    async with kubelet, watched(kubelet, ("v1", "v1alpha")) as plugin:
        (notification,) = await registration_of(plugin).wait_for_notifications()
    assert notification == (
        False,
        "RegisterPlugin error -- plugin validation failed with err: "
        "manager version, v1beta2, is not among plugin supported versions [v1 v1alpha]",
    )
    assert [(r.version, r.ok) for r in kubelet.registrations] == [("v1,v1alpha", False)]


def watched(kubelet: FakeKubelet, offered: Sequence[str]) -> ScriptedPlugin:
    assert kubelet.plugins_registry is not None
    registration = RegistrationScript(PluginInfo("DevicePlugin", RESOURCE, "", tuple(offered)))
    script = PluginScript(options=V1BETA2_FLAGS, devices=FOUR)
    return ScriptedPlugin(kubelet.plugins_registry / "w.sock", script, registration=registration, serves=BOTH)


def registration_of(plugin: ScriptedPlugin) -> RegistrationScript:
    assert plugin.registration is not None
    return plugin.registration


# -- upgrades and downgrades -------------------------------------------------------------------------


async def test_restart_with_versions_upgrades_and_downgrades_the_classic_path(plugin_dir: Path) -> None:
    """A plugin negotiating like devshim lands on v1beta2 after the upgrade, v1beta1 after the
    downgrade; a restart without versions keeps them."""
    async with new_kubelet(plugin_dir, ["v1beta1"]) as kubelet, make_plugin(kubelet) as plugin:
        steps: list[tuple[tuple[str, ...], str]] = [(kubelet.versions, await negotiate(kubelet, plugin))]
        for versions in (BOTH, None, ["v1beta2"], ["v1beta1"]):
            await kubelet.restart(CleanupMode.KUBELET_1_33, versions=versions)
            await plugin.stop()  # the cleanup removed its socket: serve again, then register again
            await plugin.start()
            steps.append((kubelet.versions, await negotiate(kubelet, plugin)))
            assert kubelet.plugin(RESOURCE).version == steps[-1][1]
    assert steps == [
        (("v1beta1",), "v1beta1"),
        (("v1beta2", "v1beta1"), "v1beta2"),
        (("v1beta2", "v1beta1"), "v1beta2"),
        (("v1beta2",), "v1beta2"),
        (("v1beta1",), "v1beta1"),
    ]


async def test_restart_with_versions_changes_the_watcher_path_version(plugin_dir: Path) -> None:
    async with new_kubelet(plugin_dir, ["v1beta1"], watcher=True) as kubelet, watched(kubelet, BOTH):
        assert (await kubelet.wait_for_registration(RESOURCE)).version == "v1beta1"
        await kubelet.restart(CleanupMode.KUBELET_1_33, versions=BOTH)
        assert (await kubelet.wait_for_registration(RESOURCE, count=2)).version == "v1beta2"
        await kubelet.restart(CleanupMode.KUBELET_1_33, versions=["v1beta1"])
        assert (await kubelet.wait_for_registration(RESOURCE, count=3)).version == "v1beta1"
        assert (await kubelet.wait_for_plugin(RESOURCE)).version == "v1beta1"


# -- Deallocate and PostStopContainer ---------------------------------------------------------------


async def register_on(kubelet: FakeKubelet, plugin: ScriptedPlugin, on: str = "v1beta2") -> PluginSession:
    await plugin.register(kubelet.kubelet_socket, RESOURCE, on=on)
    session = kubelet.plugin(RESOURCE)
    await session.wait_for_list()
    return session


def fail(device_ids: Sequence[str]) -> None:
    raise ScriptedFailure(grpc.StatusCode.INTERNAL, "no")


async def test_deallocate_and_post_stop_reach_a_v1beta2_plugin_with_the_ids(both: FakeKubelet) -> None:
    async with make_plugin(both) as plugin:
        session = await register_on(both, plugin)
        await session.post_stop(["w1", "w3"])
        await session.deallocate(["w3", "w1", "w0"])
        assert plugin.script.post_stop_calls == [("w1", "w3")]
        assert plugin.script.deallocate_calls == [("w3", "w1", "w0")]
        plugin.script.deallocate_reply = fail
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await session.deallocate(["w2"])
        assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INTERNAL, "no")


@pytest.mark.parametrize(
    ("on", "options", "message"),
    [
        pytest.param("v1beta1", V1BETA2_FLAGS, "API v1beta1 has no", id="v1beta1"),
        pytest.param("v1beta2", PluginOptions(), "options do not ask for", id="not-asked"),
    ],
)
async def test_deallocate_and_post_stop_need_v1beta2_and_the_options_flag(
    both: FakeKubelet, on: str, options: PluginOptions, message: str
) -> None:
    async with make_plugin(both, options=options) as plugin:
        session = await register_on(both, plugin, on)
        assert not (session.wants_deallocate or session.wants_post_stop)
        with pytest.raises(ProtocolViolation, match=f"{message} Deallocate"):
            await session.deallocate(["w0"])
        with pytest.raises(ProtocolViolation, match=f"{message} PostStopContainer"):
            await session.post_stop(["w0"])
    assert (plugin.script.deallocate_calls, plugin.script.post_stop_calls) == ([], [])


async def test_pods_post_stop_each_container_then_deallocate_at_the_end(both: FakeKubelet) -> None:
    """KEP-3162: PostStopContainer as each container stops, then Deallocate once the pod's
    devices are free; release() itself calls nothing."""
    calls: list[tuple[str, tuple[str, ...]]] = []
    async with make_plugin(both) as plugin:
        plugin.script.post_stop_reply = lambda ids: calls.append(("post_stop", tuple(ids)))
        plugin.script.deallocate_reply = lambda ids: calls.append(("deallocate", tuple(ids)))
        session = await register_on(both, plugin)
        pod = [ContainerSpec("setup", RESOURCE, 1, init=True), ContainerSpec("main", RESOURCE, 2)]
        assert await both.run_pod("ns", "p", pod) == {"setup": ["w0"], "main": ["w0", "w1"]}
        assert calls == [("post_stop", ("w0",))]  # the init container has run and stopped
        await both.end_pod("ns", "p")
        assert calls[1:] == [("post_stop", ("w0", "w1")), ("deallocate", ("w0", "w1"))]
        assert session.in_use == frozenset()

        ids, _ = await session.admit(1)
        session.release(ids)
        assert len(calls) == 3


async def test_a_failed_admission_deallocates_what_was_allocated(both: FakeKubelet) -> None:
    """Only Deallocate is offered: no PostStopContainer, and Deallocate for the first container's
    devices once Allocate for the second one fails."""

    def second_fails(containers: Sequence[Sequence[str]]) -> list[Grant]:
        if len(plugin.script.allocate_calls) > 1:
            raise ScriptedFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, "second container")
        return grant_per_container(containers)

    async with make_plugin(both, options=PluginOptions(deallocate_available=True)) as plugin:
        session = await register_on(both, plugin)
        plugin.script.allocate_reply = second_fails
        with pytest.raises(grpc.aio.AioRpcError):
            await both.run_pod("ns", "p", [ContainerSpec("a", RESOURCE, 1), ContainerSpec("b", RESOURCE, 1)])
        assert (plugin.script.deallocate_calls, plugin.script.post_stop_calls) == ([("w0",)], [])
        assert session.in_use == frozenset()


async def test_after_a_downgrade_a_running_pod_ends_without_v1beta2_calls(both: FakeKubelet) -> None:
    """The pod outlives the restart; the new v1beta1 session has neither call."""
    async with make_plugin(both) as plugin:
        await register_on(both, plugin)
        await both.run_pod("ns", "p", [ContainerSpec("main", RESOURCE, 2)])
        await both.restart(CleanupMode.KUBELET_1_33, versions=["v1beta1"])
        await plugin.stop()
        await plugin.start()
        assert await negotiate(both, plugin) == "v1beta1"
        await both.end_pod("ns", "p")
        assert (plugin.script.post_stop_calls, plugin.script.deallocate_calls) == ([], [])
        assert both.plugin(RESOURCE).in_use == frozenset()

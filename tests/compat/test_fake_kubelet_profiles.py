"""The fake kubelet's behaviour profiles (compat/fakekubelet/profiles.py), against scripted plugins."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from shim.compat.fakekubelet import DEPRECATION_FILE, PROFILES, DeviceState, FakeKubelet, PluginOptions
from tests.support.scripted import PluginScript
from tests.support.scripted_plugin import ScriptedPlugin

RESOURCE = "example.com/widget"
TWO = (DeviceState("w0", "Healthy"), DeviceState("w1", "Healthy"))
DECLARED = PluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


def plugin_at(plugin_dir: Path, name: str = "p.sock", options: PluginOptions = DECLARED) -> ScriptedPlugin:
    return ScriptedPlugin(plugin_dir / name, PluginScript(options=options, devices=TWO))


async def test_1_24_answers_register_before_dialing_and_reads_the_options_from_the_request(
    plugin_dir: Path,
) -> None:
    """<= 1.24: Register returns OK to a plugin that does not serve yet; the kubelet dials it
    afterwards and takes the options the request carried, never asking GetDevicePluginOptions."""
    async with FakeKubelet(plugin_dir, profile="1.24", dial_timeout_s=5) as kubelet:
        plugin = plugin_at(plugin_dir)
        await plugin.register(kubelet.kubelet_socket, RESOURCE)  # not serving: still OK
        assert (await kubelet.wait_for_registration(RESOURCE)).ok
        plugin.script.options = PluginOptions()  # what GetDevicePluginOptions would now say
        async with plugin:
            session = await kubelet.wait_for_plugin(RESOURCE)
            assert session.options == DECLARED
            assert [d.id for d in await session.wait_for_list()] == ["w0", "w1"]
        assert kubelet.connect_failures == []


async def test_1_24_logs_a_failed_dial_after_an_ok_register(plugin_dir: Path) -> None:
    async with FakeKubelet(plugin_dir, profile="1.24", dial_timeout_s=0.3) as kubelet:
        await plugin_at(plugin_dir).register(kubelet.kubelet_socket, RESOURCE)
        assert (await kubelet.wait_for_registration(RESOURCE)).ok
        await kubelet.wait_until(lambda: bool(kubelet.connect_failures), timeout=5)
        assert "failed to dial device plugin" in kubelet.connect_failures[0]
        with pytest.raises(KeyError):
            kubelet.plugin(RESOURCE)


@pytest.mark.parametrize("profile", ["1.25-1.32", "1.33+", "next"])
async def test_1_25_and_later_refuse_a_plugin_that_is_not_serving(plugin_dir: Path, profile: str) -> None:
    async with FakeKubelet(plugin_dir, profile=profile, dial_timeout_s=0.3) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError, match="failed to dial device plugin"):
            await plugin_at(plugin_dir).register(kubelet.kubelet_socket, RESOURCE)


@pytest.mark.parametrize("profile", list(PROFILES))
async def test_every_start_creates_deprecation_and_a_restart_cleans_by_the_profile(
    plugin_dir: Path, profile: str
) -> None:
    async with FakeKubelet(plugin_dir, profile=profile) as kubelet:
        assert (plugin_dir / DEPRECATION_FILE).exists() == PROFILES[profile].deprecation_file
        (plugin_dir / "notes.txt").write_text("a regular file")
        await kubelet.restart()
        assert (plugin_dir / "notes.txt").exists() == (PROFILES[profile].cleanup == "1.33")
        # Removed or not by the cleanup, created again after it by the kubelets that make it.
        assert (plugin_dir / DEPRECATION_FILE).exists() == PROFILES[profile].deprecation_file


@pytest.mark.parametrize(("profile", "torn_down"), [("1.25-1.32", True), ("1.33+", True), ("next", False)])
async def test_a_replaced_stream_ending_late_tears_down_the_new_registration_before_the_fix(
    plugin_dir: Path, profile: str, torn_down: bool
) -> None:
    """kubernetes #121994: a plugin re-registers (new socket) while its old stream is open; when
    the old stream then ends, kubelets before PR #135437 disconnect the resource by name, i.e. the
    new registration. `next` matches the client by socket too and keeps the new one."""
    async with FakeKubelet(plugin_dir, profile=profile) as kubelet, plugin_at(plugin_dir, "old.sock") as old:
        await old.register(kubelet.kubelet_socket, RESOURCE)
        first = await kubelet.wait_for_plugin(RESOURCE)
        await first.wait_for_list()
        async with plugin_at(plugin_dir, "new.sock") as new:
            await new.register(kubelet.kubelet_socket, RESOURCE)
            second = kubelet.plugin(RESOURCE)
            assert second is not first
            await second.wait_for_list()
            assert first.stream_ended.is_set() == (not torn_down)  # `next`: the fake closed it
            await old.stop()  # the old plugin goes away late
            await first.stream_ended.wait()
            if torn_down:
                await second.stream_ended.wait()
                assert "#121994" in (second.stream_error or "")
                with pytest.raises(KeyError):
                    kubelet.plugin(RESOURCE)
            else:
                assert not second.stream_ended.is_set() and kubelet.plugin(RESOURCE) is second

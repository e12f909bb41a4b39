"""The legacy adapter (adapters/legacy) restarted: its resources stay served, Unhealthy and back.

devshim removes a resource a restarted driver no longer declares, so an adapter that declared
only what its legacy plugin had listed withdrew them after each restart (issue 42, item 4). With
``--resource`` it declares them from the start and lists their devices only once the plugin has;
the kubelet sees the same devices Unhealthy, then Healthy, never a list without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sys
from pathlib import Path

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.compat.fakekubelet.errors import EndpointStopped
from shim.compat.fakekubelet.session import DeviceList
from shim.settings import Settings
from tests.support.legacy import PYTHON_PLUGIN, RESOURCE, legacy_driver, plugin_env, served
from tests.support.shim_fixtures import logged

IDS = ["p0", "p1", "p2"]
REMOVED = "no longer served"


def adapter_pid(shim: Shim) -> int:
    process = shim.drivers[0].process
    assert process is not None and process.returncode is None
    return process.pid


async def appeared(socket: Path, replacing: int | None = None) -> None:
    """Wait for the adapter's kubelet.sock (another than the one of inode ``replacing``)."""
    async with asyncio.timeout(30):
        while not socket.exists() or socket.stat().st_ino == replacing:
            await asyncio.sleep(0.05)


def healthy(devices: DeviceList) -> bool:
    return [d.id for d in devices] == IDS and all(d.healthy for d in devices)


def unhealthy(devices: DeviceList) -> bool:
    return [d.id for d in devices] == IDS and not any(d.healthy for d in devices)


async def unhealthy_then_back(session: PluginSession) -> None:
    """The same three devices listed Unhealthy, then Healthy, by the same registration."""
    await session.wait_for_list(unhealthy)
    await session.wait_for_list(healthy, timeout=60)


def assert_never_withdrawn(session: PluginSession, messages: list[str]) -> None:
    """One registration all along, every list of it holding the devices; devshim never removed them."""
    assert not session.stream_ended.is_set(), session.stream_error
    assert_full([session], messages)


def assert_full(sessions: list[PluginSession], messages: list[str]) -> None:
    for session in sessions:
        assert all(sorted(d.id for d in ds) == IDS for ds in session.lists), session.lists
    assert not [m for m in messages if REMOVED in m]


async def healthy_again(kubelet: FakeKubelet) -> PluginSession:
    """The kubelet's session of the resource registered with the plugin's own options (it asks
    for pre-start) once it lists the devices Healthy; earlier sessions are replaced by it."""
    async with asyncio.timeout(60):
        while True:
            session = kubelet.plugin(RESOURCE)
            if session.options.pre_start_required:
                with contextlib.suppress(EndpointStopped):
                    await session.wait_for_list(healthy, timeout=60)
                    return session
            await kubelet.wait_until(functools.partial(replaced, kubelet, session), timeout=60)


def replaced(kubelet: FakeKubelet, session: PluginSession) -> bool:
    return kubelet.plugin(RESOURCE) is not session


async def test_a_killed_adapter_shows_its_devices_unhealthy_and_back(
    plugin_dir: Path, state_dir: Path, private_dir: Path, stubs: Path
) -> None:
    """The adapter (the plugin its child) is SIGKILLed; devshim restarts it, and it starts the
    plugin again: the kubelet's one session shows the devices Unhealthy, then Healthy."""
    command = [sys.executable, str(PYTHON_PLUGIN / "plugin.py")]
    env = plugin_env(private_dir, stubs)
    with logged("INFO") as messages:
        async with served(
            plugin_dir, state_dir, private_dir, command, env, adapter_args=["--resource", RESOURCE]
        ) as (session, shim):
            killed = adapter_pid(shim)
            os.kill(killed, signal.SIGKILL)
            await unhealthy_then_back(session)
            assert adapter_pid(shim) != killed
            assert_never_withdrawn(session, messages)
            assert (await session.allocate(["p1"])).envs == {"PYPLUG": "p1"}


async def test_a_plugin_that_does_not_come_back_leaves_its_devices_unhealthy(
    plugin_dir: Path, state_dir: Path, private_dir: Path, stubs: Path, kubelet: FakeKubelet
) -> None:
    """Sidecar form: the adapter is SIGKILLed and the plugin (which registers only once, at its
    start) does not register with the new one. The devices stay listed Unhealthy through the
    restarted adapter's failed starts; the plugin restarted, they are Healthy again. (Declared
    before the plugin's options are known, the resource is registered with the kubelet again as
    they change: a new session of the same devices, never a withdrawal.)"""
    argv = [sys.executable, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private_dir)]
    argv += ["--resource", RESOURCE, "--list-wait", "1"]
    settings = Settings.load(
        device_plugins_dir=plugin_dir, state_dir=state_dir, drivers=[legacy_driver(argv)]
    )
    plugin = [sys.executable, str(PYTHON_PLUGIN / "plugin.py")]
    env = plugin_env(private_dir, stubs)
    socket = private_dir / "kubelet.sock"
    sidecars: list[asyncio.subprocess.Process] = []
    with logged("INFO") as messages:
        async with Shim(settings) as shim:
            try:
                # A legacy plugin that finds no kubelet.sock exits (its container is restarted).
                await appeared(socket)
                sidecars.append(await asyncio.create_subprocess_exec(*plugin, env=env))
                first = await kubelet.wait_for_plugin(RESOURCE, timeout=30)
                await first.wait_for_list(healthy, timeout=30)
                os.kill(adapter_pid(shim), signal.SIGKILL)
                await first.wait_for_list(unhealthy)
                # The restarted adapter waited for a plugin that never came and failed its start.
                async with asyncio.timeout(60):
                    while not any("failed to start" in m for m in messages):
                        await asyncio.sleep(0.05)
                assert_full([first, kubelet.plugin(RESOURCE)], messages)
                assert unhealthy(kubelet.plugin(RESOURCE).latest)
                # The plugin's container restarts once the next adapter serves (its kubelet.sock
                # replaces the failed one's), and registers with it.
                failed = socket.stat().st_ino if socket.exists() else None
                sidecars[0].terminate()
                await sidecars[0].wait()
                await appeared(socket, replacing=failed)
                sidecars.append(await asyncio.create_subprocess_exec(*plugin, env=env))
                last = await healthy_again(kubelet)
                assert_full([first, last], messages)
                assert (await last.allocate(["p0"])).envs == {"PYPLUG": "p0"}
            finally:
                for sidecar in sidecars:
                    if sidecar.returncode is None:
                        sidecar.terminate()
                        await sidecar.wait()

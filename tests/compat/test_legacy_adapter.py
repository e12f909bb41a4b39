"""devshim in front of an unmodified legacy v1beta1 plugin (adapters/legacy), both forms.

The legacy plugin here is tests/support/legacy_plugins/python: it shares no code with devshim
and runs on stubs generated, for this test, from its own copy of the proto.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.settings import Settings
from tests.support.legacy import PYTHON_PLUGIN, RESOURCE, legacy_driver, legacy_pid, plugin_env, served


async def test_the_subprocess_form_serves_the_legacy_plugin_end_to_end(
    plugin_dir: Path, state_dir: Path, private_dir: Path, stubs: Path
) -> None:
    """Register, list, options, preferred allocation, Allocate, pre-start and a health flip of a
    plugin the adapter started, all seen from the real kubelet's side."""
    command = [sys.executable, str(PYTHON_PLUGIN / "plugin.py")]
    async with served(plugin_dir, state_dir, private_dir, command, plugin_env(private_dir, stubs)) as (
        session,
        shim,
    ):
        assert [d.id for d in session.latest] == ["p0", "p1", "p2"]
        assert session.options.pre_start_required and session.options.get_preferred_allocation_available
        assert await session.preferred_allocation(["p0", "p1", "p2"], ["p2"], 2) == ["p2", "p0"]
        assert (await session.allocate(["p0", "p1"])).envs == {"PYPLUG": "p0,p1"}
        await session.prestart(["p0"])
        os.kill(legacy_pid(shim), signal.SIGUSR1)
        flipped = await session.wait_for_list(lambda ds: not ds[2].healthy, timeout=10)
        assert [d.health for d in flipped] == ["Healthy", "Healthy", "Unhealthy"]


async def test_a_crashed_legacy_plugin_is_restarted_and_its_devices_return(
    plugin_dir: Path, state_dir: Path, private_dir: Path, stubs: Path
) -> None:
    """The legacy plugin crashes: its devices are listed Unhealthy (never dropped), the adapter
    restarts it, it registers again and its devices come back Healthy."""
    command = [sys.executable, str(PYTHON_PLUGIN / "plugin.py")]
    async with served(plugin_dir, state_dir, private_dir, command, plugin_env(private_dir, stubs)) as (
        session,
        shim,
    ):
        os.kill(legacy_pid(shim), signal.SIGUSR2)
        await session.wait_for_list(lambda ds: len(ds) == 3 and not any(d.healthy for d in ds), timeout=10)
        back = await session.wait_for_list(lambda ds: len(ds) == 3 and all(d.healthy for d in ds), timeout=30)
        assert [d.id for d in back] == ["p0", "p1", "p2"]
        assert (await session.allocate(["p2"])).envs == {"PYPLUG": "p2"}


async def test_the_sidecar_form_serves_a_plugin_started_elsewhere(
    plugin_dir: Path, state_dir: Path, private_dir: Path, stubs: Path, kubelet: FakeKubelet
) -> None:
    """With no command the adapter only plays kubelet on the shared directory; a plugin started
    by someone else (its own container) registers there, even one that registers before it
    serves, a bug older kubelets tolerated."""
    argv = [sys.executable, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private_dir)]
    settings = Settings.load(
        device_plugins_dir=plugin_dir, state_dir=state_dir, drivers=[legacy_driver(argv)]
    )
    env = {**plugin_env(private_dir, stubs), "PY_REGISTER_FIRST": "1"}
    shim = Shim(settings)
    starting = asyncio.create_task(shim.start())
    sidecar: asyncio.subprocess.Process | None = None
    try:
        # The sidecar container starts once the shared directory has our kubelet.sock (a
        # legacy plugin that finds none exits, and its container is restarted).
        for _ in range(400):
            if (private_dir / "kubelet.sock").exists():
                break
            await asyncio.sleep(0.05)
        plugin = str(PYTHON_PLUGIN / "plugin.py")
        sidecar = await asyncio.create_subprocess_exec(sys.executable, plugin, env=env)
        await starting
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=30)
        await session.wait_for_list(lambda ds: len(ds) == 3 and all(d.healthy for d in ds), timeout=30)
        assert (await session.allocate(["p1"])).envs == {"PYPLUG": "p1"}
    finally:
        await shim.stop()
        if sidecar is not None:
            sidecar.terminate()
            await sidecar.wait()

"""A plugin's options, as the kubelet holds them, follow what the driver declares (issue 42, item 1).

A kubelet reads a plugin's options once per registration (1.25+: GetDevicePluginOptions as it
connects) and keeps them for that connection, as the fake kubelet's sessions do. devshim restarted
on its state folder serves each driver resource at once, restored from its inventory, before its
driver has said which optional calls it makes: restored with the capabilities the driver last
declared, it registers once with the right options; when the driver then declares others (an
upgraded driver), it registers again, or the kubelet would never make the new calls until it
restarts itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.model import Health
from shim.settings import Settings
from tests.support import AS_ROOT, DRIVERS

GPU = "example.com/over"
WAIT_S = 20.0
# The same resource, served by a driver that makes no optional call, then by one that makes both.
PLAIN = [sys.executable, "-m", "devshim_adapters.sim", "--config-json"]
PLAIN += [json.dumps({"resources": [{"name": GPU, "count": 3, "id_prefix": "o-"}]})]
OVERPROMISING = [sys.executable, str(DRIVERS / "overpromising.py")]  # declares both, answers -32601


def settings(plugin_dir: Path, state_dir: Path, command: list[str]) -> Settings:
    driver: dict[str, Any] = {
        "name": "gpu",
        "command": command,
        "resources": [GPU],
        "policy": {"envs": ["OVER"]},
    }
    return Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        drivers=[{**driver, **AS_ROOT}],
    )


def registrations(kubelet: FakeKubelet) -> int:
    return sum(1 for r in kubelet.registrations if r.resource_name == GPU and r.ok)


async def healthy(kubelet: FakeKubelet) -> None:
    session = kubelet.plugin(GPU)
    await session.wait_for_list(
        lambda devices: len(devices) == 3 and all(d.health == Health.HEALTHY for d in devices)
    )


async def test_a_driver_declaring_other_calls_after_a_restart_is_registered_again(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    async with Shim(settings(plugin_dir, state_dir, PLAIN)):
        await kubelet.wait_for_plugin(GPU, timeout=WAIT_S)
        await healthy(kubelet)
    assert not kubelet.plugin(GPU).options.pre_start_required
    before = registrations(kubelet)

    # Restored with no optional calls (what the last driver declared); this one declares both.
    async with Shim(settings(plugin_dir, state_dir, OVERPROMISING)) as shim:
        await kubelet.wait_until(
            lambda: (
                registrations(kubelet) == before + 2
                and kubelet.plugin(GPU).options.pre_start_required
                and kubelet.plugin(GPU).options.get_preferred_allocation_available
            ),
            timeout=WAIT_S,
            what="a second registration, whose connection holds the options the driver declares",
        )
        await healthy(kubelet)
        await kubelet.plugin(GPU).admit(1)  # as the kubelet admits a pod: with both calls now
        calls = shim.drivers[0].calls
        # The driver answers both with -32601 (not implemented): devshim answers the kubelet anyway.
        assert calls["prestart"].ok + calls["prestart"].failed == 1, calls
        assert calls["preferred_allocation"].ok + calls["preferred_allocation"].failed == 1, calls


async def test_a_restarted_devshim_registers_once_with_the_options_its_driver_declared(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """The inventory keeps what the driver declared: the restored resource's one registration
    already carries the options, and the driver's declaring them again changes nothing."""
    async with Shim(settings(plugin_dir, state_dir, OVERPROMISING)):
        await kubelet.wait_for_plugin(GPU, timeout=WAIT_S)
        await healthy(kubelet)
    before = registrations(kubelet)
    async with Shim(settings(plugin_dir, state_dir, OVERPROMISING)) as shim:
        await kubelet.wait_until(
            lambda: registrations(kubelet) == before + 1, timeout=WAIT_S, what="registered"
        )
        assert kubelet.plugin(GPU).options.pre_start_required, "restored with the declared options"
        await healthy(kubelet)  # the driver is up and has declared its calls again
        assert shim.drivers[0].status == "up"
    assert registrations(kubelet) == before + 1, "registered once"

"""A plugin's options, as the kubelet holds them, follow what the driver declares (issue 42, item 1).

A kubelet reads a plugin's options once per registration (1.25+: GetDevicePluginOptions as it
connects) and keeps them for that connection, as the fake kubelet's sessions do. devshim restarted
on its state folder serves each driver resource at once, restored from its inventory with no
optional calls, before its driver has said which it makes: once the driver declares
PreStartContainer and GetPreferredAllocation, devshim must register again, or the kubelet never
calls either until it restarts itself. A resource whose options did not change is not
registered again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shim.bootstrap import Shim
from shim.kubelet import FakeKubelet
from shim.model import Health
from shim.settings import Settings
from tests.support import AS_ROOT, DRIVERS

OVER, PLAIN = "example.com/over", "example.com/plain"
WAIT_S = 20.0


def settings(plugin_dir: Path, state_dir: Path) -> Settings:
    plain = json.dumps({"resources": [{"name": PLAIN, "count": 2}]})
    return Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        drivers=[
            {
                "name": "over",  # declares prestart and preferred allocation
                "command": [sys.executable, str(DRIVERS / "overpromising.py")],
                "resources": [OVER],
                "policy": {"envs": ["OVER"]},
                **AS_ROOT,
            },
            {
                "name": "plain",  # declares neither
                "command": [sys.executable, "-m", "devshim_adapters.sim", "--config-json", plain],
                "resources": [PLAIN],
                **AS_ROOT,
            },
        ],
    )


def registrations(kubelet: FakeKubelet, resource: str) -> int:
    return sum(1 for r in kubelet.registrations if r.resource_name == resource and r.ok)


async def test_a_restarted_devshim_registers_again_once_the_driver_declares_its_optional_calls(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    async with Shim(settings(plugin_dir, state_dir)):
        first = await kubelet.wait_for_plugin(OVER, timeout=WAIT_S)
        await first.wait_for_list()
        assert first.options.pre_start_required and first.options.get_preferred_allocation_available
        await kubelet.wait_for_plugin(PLAIN, timeout=WAIT_S)
    over_before, plain_before = registrations(kubelet, OVER), registrations(kubelet, PLAIN)

    # Stopped gracefully: each inventory holds its resource, served again at once on the restart.
    async with Shim(settings(plugin_dir, state_dir)) as shim:
        await kubelet.wait_until(
            lambda: (
                registrations(kubelet, OVER) > over_before
                and kubelet.plugin(OVER).options.pre_start_required
                and kubelet.plugin(OVER).options.get_preferred_allocation_available
            ),
            timeout=WAIT_S,
            what="the kubelet's connection holding the options the driver declares",
        )
        session = kubelet.plugin(OVER)
        await session.wait_for_list(lambda devices: all(d.health == Health.HEALTHY for d in devices))
        await session.admit(1)  # as the kubelet admits a pod: PreStartContainer, as the options say
        calls = shim.drivers[0].calls
        # The driver answers both with -32601 (not implemented): devshim answers the kubelet anyway.
        assert calls["prestart"].ok + calls["prestart"].failed == 1, calls
        assert calls["preferred_allocation"].ok + calls["preferred_allocation"].failed == 1, calls

        plain = kubelet.plugin(PLAIN)
        await plain.wait_for_list(
            lambda devices: len(devices) == 2 and all(d.health == Health.HEALTHY for d in devices)
        )
        assert shim.drivers[1].status == "up"
    assert registrations(kubelet, PLAIN) == plain_before + 1, "options unchanged: registered once"

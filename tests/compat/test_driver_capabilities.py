"""Optional driver capabilities degrade gracefully when the driver answers -32601."""

from __future__ import annotations

import sys
from pathlib import Path

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.settings import Settings
from tests.support import DRIVERS

DRIVER = DRIVERS / "overpromising.py"


async def test_declared_but_unimplemented_methods_do_not_fail_admission(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """The driver declares preferred allocation and pre-start, then answers -32601 for both:
    the kubelet still gets exactly allocation_size IDs and a successful PreStartContainer, so
    pods are admitted instead of failing on an optional call."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        drivers=[
            {
                "name": "over",
                "user": "root",
                "command": [sys.executable, str(DRIVER)],
                "resources": ["example.com/over"],
                "policy": {"envs": ["OVER"]},
            }
        ],
    )
    async with Shim(settings):
        session = await kubelet.wait_for_plugin("example.com/over", timeout=20)
        await session.wait_for_list()
        assert session.options.pre_start_required and session.options.get_preferred_allocation_available
        chosen = await session.preferred_allocation(["o-0", "o-1", "o-2"], ["o-2"], 2)
        assert len(chosen) == 2 and "o-2" in chosen
        ids, grant = await session.admit(1)
        assert grant.envs == {"OVER": ids[0]}
        await session.prestart(ids)

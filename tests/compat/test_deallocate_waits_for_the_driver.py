"""A deallocate right after devshim starts waits for the driver (issue 42, item 7): an
Unprepare the kubelet sends as devshim comes back used to fail once with "the driver is not
running", though the driver was only starting. It waits up to ``restart.call_wait_s`` for the
driver's first list, then reaches it; a driver that stays down still fails it, saying why.

devshim in-process with the sim as a real subprocess, started behind a gate (a file) so the
test decides when the driver is up; the resource is served from its inventory meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.errors import SourceUnavailable
from shim.settings import Settings
from tests.support import AS_ROOT

GPU = "example.com/gpu"
WAIT_S = 20.0
# The driver starts once the gate file exists.
GATE = (
    "import os, sys, time\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.02)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def settings(plugin_dir: Path, state_dir: Path, gate: Path, call_wait_s: float) -> Settings:
    sim = json.dumps({"resources": [{"name": GPU, "count": 2, "id_prefix": "gpu-", "deallocate": True}]})
    driver: dict[str, Any] = {
        "name": "sim",
        "command": [sys.executable, "-c", GATE, str(gate), sys.executable, "-m", "devshim_adapters.sim"]
        + ["--config-json", sim],
        "resources": [GPU],
        "restart": {"call_wait_s": call_wait_s},
        **AS_ROOT,
    }
    return Settings.load(device_plugins_dir=plugin_dir, state_dir=state_dir, drivers=[driver])


async def saved_inventory(plugin_dir: Path, state_dir: Path, gate: Path) -> None:
    """One run with the gate open: the resource's devices are in the inventory afterwards."""
    gate.touch()
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings(plugin_dir, state_dir, gate, 10)):
        await (await kubelet.wait_for_plugin(GPU, timeout=WAIT_S)).wait_for_list(lambda d: len(d) == 2)
    gate.unlink()


async def test_a_deallocate_as_devshim_starts_waits_for_the_driver(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    await saved_inventory(plugin_dir, state_dir, gate)
    async with Shim(settings(plugin_dir, state_dir, gate, 10)) as shim:
        host = shim.drivers[0]
        source = host.sources[GPU]  # restored from the inventory: served, the driver not up
        deallocating = asyncio.create_task(source.deallocate(["gpu-0"]))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not deallocating.done(), "it waits for the driver instead of failing"
        gate.touch()
        async with asyncio.timeout(WAIT_S):
            await deallocating
        assert host.calls["deallocate"].ok == 1


async def test_a_driver_that_stays_down_fails_the_deallocate_saying_so(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    await saved_inventory(plugin_dir, state_dir, gate)
    async with Shim(settings(plugin_dir, state_dir, gate, 0.2)) as shim:
        with pytest.raises(SourceUnavailable, match="the driver is not running; deallocate once it is back"):
            await shim.drivers[0].sources[GPU].deallocate(["gpu-0"])
        gate.touch()  # let it start, so that it stops as a driver does, not as a launcher stuck
        async with asyncio.timeout(WAIT_S):
            while shim.drivers[0].status != "up":
                await asyncio.sleep(0.02)

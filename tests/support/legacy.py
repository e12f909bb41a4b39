"""The legacy adapter (adapters/legacy) in front of a plugin of tests/support/legacy_plugins,
behind devshim and the fake kubelet. (The fixtures that build those plugins, and the adapter's
private directory, are in tests/compat/conftest.py.)"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.compat.plugin_world import PluginUnderTest
from shim.settings import Settings
from tests.support import LEGACY_PLUGINS

PYTHON_PLUGIN = LEGACY_PLUGINS / "python"  # the Python plugin: plugin.py, register.py, api.proto
GO_PLUGIN = LEGACY_PLUGINS / "go"  # the Go plugin: a Go module, built by build.sh
RESOURCE = "example.com/pyplug"  # the Python plugin's resource
PYTHON_POLICY = {"envs": ["PYPLUG"]}  # what the Python plugin's Allocate grants
# What compat runs to make a plugin change a device: both test plugins flip the last on SIGUSR1.
FLIP = 'kill -USR1 "$DEVSHIM_COMPAT_PLUGIN_PID"'


def legacy_driver(
    argv: list[str], resource: str = RESOURCE, policy: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The adapter as devshim's driver "legacy", serving ``resource`` and granting what ``policy``
    (by default the Python plugin's) allows."""
    return {
        "name": "legacy",
        "user": "root",
        "command": argv,
        "resources": [resource],
        "policy": PYTHON_POLICY if policy is None else policy,
    }


def python_plugin(stub_dir: Path, env: dict[str, str], *, hardcoded: bool = False) -> PluginUnderTest:
    """The Python plugin as `devshim compat --plugin` takes it, told its directory through DP_DIR
    (or left to hard-code the kubelet's), FLIP its health hook."""
    base = {k: v for k, v in os.environ.items() if k != "DP_DIR"}
    prefix = "" if hardcoded else "env DP_DIR={dir} "
    command = f"{prefix}{shlex.quote(sys.executable)} {shlex.quote(str(PYTHON_PLUGIN / 'plugin.py'))}"
    return PluginUnderTest(command, None, {**base, "PYTHONPATH": str(stub_dir), **env}, FLIP)


def plugin_env(private_dir: Path, stubs: Path, **extra: str) -> dict[str, str]:
    """The Python plugin's environment: its kubelet directory and its generated stubs."""
    return {"DP_DIR": str(private_dir), "PYTHONPATH": str(stubs), **extra}


@asynccontextmanager
async def served(
    plugin_dir: Path,
    state_dir: Path,
    private_dir: Path,
    command: list[str],
    env: dict[str, str],
    resource: str = RESOURCE,
    adapter_args: Sequence[str] = (),
    policy: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[PluginSession, Shim]]:
    """devshim with the legacy adapter as its driver, the adapter starting ``command`` with ``env``
    and playing kubelet in ``private_dir``: the kubelet's session of ``resource`` once its three
    devices are listed Healthy, and the Shim. ``policy``: what the plugin's grants hold
    (legacy_driver)."""
    argv = [sys.executable, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private_dir), *adapter_args]
    argv += [arg for key, value in env.items() for arg in ("--plugin-env", f"{key}={value}")]
    if command:
        argv += ["--", *command]
    settings = Settings.load(
        device_plugins_dir=plugin_dir, state_dir=state_dir, drivers=[legacy_driver(argv, resource, policy)]
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings) as shim:
        session = await kubelet.wait_for_plugin(resource, timeout=30)
        await session.wait_for_list(lambda ds: len(ds) == 3 and all(d.healthy for d in ds), timeout=30)
        yield session, shim


def legacy_pid(shim: Shim) -> int:
    """The process ID of the legacy plugin the adapter (devshim's first driver) started."""
    adapter = shim.drivers[0].process
    assert adapter is not None
    for task in Path(f"/proc/{adapter.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            return int(child)
    raise LookupError("the adapter has no legacy plugin process")

"""devshim in front of an unmodified legacy v1beta1 plugin (adapters/legacy), both forms.

The legacy plugin here is tests/support/legacy_plugins/python: it shares no code with devshim
and runs on stubs generated, for this test, from its own copy of the proto.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from shim.bootstrap import Shim
from shim.kubelet import FakeKubelet, PluginSession
from shim.settings import Settings
from tests.support import LEGACY_PLUGINS

HERE = LEGACY_PLUGINS / "python"
RESOURCE = "example.com/pyplug"


@pytest.fixture(scope="module")
def stubs() -> Iterator[Path]:
    """The legacy plugin's own generated stubs, as its vendor would build them."""
    out = Path(tempfile.mkdtemp(prefix="ds-stubs-"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{HERE}", f"--python_out={out}",
         f"--grpc_python_out={out}", "api.proto"],
        check=True,
    )  # fmt: skip
    yield out
    shutil.rmtree(out, ignore_errors=True)


@pytest.fixture
def private_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ds-priv-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def plugin_env(private_dir: Path, stubs: Path, **extra: str) -> dict[str, str]:
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
) -> AsyncIterator[tuple[PluginSession, Shim]]:
    argv = [sys.executable, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private_dir), *adapter_args]
    argv += [arg for key, value in env.items() for arg in ("--plugin-env", f"{key}={value}")]
    if command:
        argv += ["--", *command]
    settings = Settings.load(
        device_plugins_dir=plugin_dir, state_dir=state_dir, drivers=[{"name": "legacy", "command": argv}]
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings) as shim:
        session = await kubelet.wait_for_plugin(resource, timeout=30)
        await session.wait_for_list(lambda ds: len(ds) == 3 and all(d.healthy for d in ds), timeout=30)
        yield session, shim


def legacy_pid(shim: Shim) -> int:
    adapter = shim.drivers[0].process
    assert adapter is not None
    for task in Path(f"/proc/{adapter.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            return int(child)
    raise LookupError("the adapter has no legacy plugin process")


async def test_the_subprocess_form_serves_the_legacy_plugin_end_to_end(
    plugin_dir: Path, state_dir: Path, private_dir: Path, stubs: Path
) -> None:
    """Register, list, options, preferred allocation, Allocate, pre-start and a health flip of a
    plugin the adapter started, all seen from the real kubelet's side."""
    command = [sys.executable, str(HERE / "plugin.py")]
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
    command = [sys.executable, str(HERE / "plugin.py")]
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
    plugin_dir: Path, state_dir: Path, private_dir: Path, stubs: Path
) -> None:
    """With no command the adapter only plays kubelet on the shared directory; a plugin started
    by someone else (its own container) registers there, even one that registers before it
    serves, a bug older kubelets tolerated."""
    argv = [sys.executable, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private_dir)]
    settings = Settings.load(
        device_plugins_dir=plugin_dir, state_dir=state_dir, drivers=[{"name": "legacy", "command": argv}]
    )
    env = {**plugin_env(private_dir, stubs), "PY_REGISTER_FIRST": "1"}
    async with FakeKubelet(plugin_dir) as kubelet:
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
            sidecar = await asyncio.create_subprocess_exec(sys.executable, str(HERE / "plugin.py"), env=env)
            await starting
            session = await kubelet.wait_for_plugin(RESOURCE, timeout=30)
            await session.wait_for_list(lambda ds: len(ds) == 3 and all(d.healthy for d in ds), timeout=30)
            assert (await session.allocate(["p1"])).envs == {"PYPLUG": "p1"}
        finally:
            await shim.stop()
            if sidecar is not None:
                sidecar.terminate()
                await sidecar.wait()

"""The devfs driver (adapters/devfs) behind devshim, seen from the fake kubelet."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.settings import Settings

SERIAL = "example.com/devfs-serial"


@asynccontextmanager
async def served(
    plugin_dir: Path, state_dir: Path, dev: Path, api_versions: Sequence[str] = ("v1beta1",)
) -> AsyncIterator[PluginSession]:
    """devshim running devfs over ``dev``/ttyUSB*, registered with a fake kubelet speaking
    ``api_versions``; the session once its first list arrived."""
    config = state_dir / "devfs.json"
    group = {"resource": SERIAL, "paths": [str(dev / "ttyUSB*")], "container_path": "/dev/serial/{name}"}
    config.write_text(json.dumps({"groups": [group], "poll_interval_s": 0.2}))
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        api_versions=list(api_versions),
        drivers=[
            {
                "name": "devfs",
                "user": "root",
                "command": [sys.executable, "-m", "devshim_adapters.devfs", "--config", str(config)],
                "resources": [SERIAL],
                # The test's nodes are regular files in a temp dir (below /tmp, which anyone may
                # write to), not character devices: the policy allows exactly them.
                "policy": {
                    "device_nodes": [str(dev / "ttyUSB*")],
                    "device_node_types": None,
                    "allow_world_writable_dirs": True,
                },
            }
        ],
    )
    async with FakeKubelet(plugin_dir, versions=tuple(api_versions)) as kubelet, Shim(settings):
        session = await kubelet.wait_for_plugin(SERIAL, timeout=20)
        await session.wait_for_list()
        yield session


def two_adapters(tmp_path: Path) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("ttyUSB0", "ttyUSB1"):
        (dev / name).touch()
    return dev


async def test_nodes_are_listed_and_allocated_from_declared_grants(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """Both adapters are registered and listed; Allocate of both gives each host node at its
    configured container path, merged from the grants the driver declared."""
    dev = two_adapters(tmp_path)
    async with served(plugin_dir, state_dir, dev) as serial:
        assert serial.version == "v1beta1"
        assert [(d.id, d.health) for d in serial.latest] == [("ttyUSB0", "Healthy"), ("ttyUSB1", "Healthy")]
        grant = await serial.allocate(["ttyUSB1", "ttyUSB0"])
    assert grant.device_nodes == (
        ("/dev/serial/ttyUSB1", str(dev / "ttyUSB1"), "rw"),
        ("/dev/serial/ttyUSB0", str(dev / "ttyUSB0"), "rw"),
    )


async def test_a_node_plugged_in_reaches_an_open_list_and_watch_as_a_new_full_list(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """Hot-plug while ListAndWatch is open: the kubelet gets all three adapters in one list,
    and the new one can be allocated at once."""
    dev = two_adapters(tmp_path)
    async with served(plugin_dir, state_dir, dev) as serial:
        (dev / "ttyUSB2").touch()
        devices = await serial.wait_for_list(lambda ds: len(ds) == 3)
        assert [d.id for d in devices] == ["ttyUSB0", "ttyUSB1", "ttyUSB2"]
        grant = await serial.allocate(["ttyUSB2"])
    assert grant.device_nodes == (("/dev/serial/ttyUSB2", str(dev / "ttyUSB2"), "rw"),)


async def test_a_v1beta2_kubelet_gets_a_v1beta2_session_that_allocates(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """With v1beta2 offered and spoken by the kubelet, the session is v1beta2 and Allocate works."""
    dev = two_adapters(tmp_path)
    async with served(plugin_dir, state_dir, dev, api_versions=("v1beta1", "v1beta2")) as serial:
        assert serial.version == "v1beta2"
        grant = await serial.allocate(["ttyUSB0"])
    assert grant.device_nodes == (("/dev/serial/ttyUSB0", str(dev / "ttyUSB0"), "rw"),)


async def test_devfs_under_devshim_run_serves_real_dev_nodes(
    plugin_dir: Path, state_dir: Path, tmp_path: Path, kubelet: FakeKubelet
) -> None:
    """`devshim run --driver devfs=...` as a real process: /dev/null, /dev/zero and /dev/full
    reach the kubelet, and Allocate grants the real device nodes, declared on the command line."""
    config = tmp_path / "devfs.json"
    nodes = ["/dev/null", "/dev/zero", "/dev/full"]
    group = {"resource": "example.com/nullish", "paths": nodes}
    config.write_text(json.dumps({"groups": [group]}))
    command = f"{shlex.quote(sys.executable)} -m devshim_adapters.devfs --config {shlex.quote(str(config))}"
    allowed = [f"--driver-allow=devfs=device_nodes:{node}" for node in nodes]
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "shim", "run", "--device-plugins-dir", str(plugin_dir)),
        *("--state-dir", str(state_dir), "--driver", f"devfs={command}", "--driver-user", "devfs=root"),
        *("--driver-resource", "devfs=example.com/nullish", *allowed),
    )
    try:
        session = await kubelet.wait_for_plugin("example.com/nullish", timeout=30)
        listed = await session.wait_for_list(lambda ds: len(ds) == 3)
        assert sorted(d.id for d in listed) == ["full", "null", "zero"]
        grant = await session.allocate(["zero"])
        assert grant.device_nodes == (("/dev/zero", "/dev/zero", "rw"),)
    finally:
        proc.terminate()
        assert await proc.wait() == 0

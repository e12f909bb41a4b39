"""Who a driver runs as by default: under a root devshim, nobody, with the groups of the device
nodes its policy declares and no others (driverhost/identity.py); root only where the settings
say root. The driver is tests/support/drivers/hardened.py, whose device IDs say what it saw of
itself, so the fake kubelet's list proves it; the device nodes are real ones, made with mknod in
a scratch folder that the policy's globs name.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.driverhost.identity import DEFAULT_UID, Identity, identity
from shim.settings import DriverSettings, Settings
from tests.support import ROOT
from tests.support.privileges import HARDENED, NOBODY_PYTHON, needs_nobody

WHO = "example.com/who"
WAIT_S = 20.0
FPGA_GROUP, SHARED_GROUP, SHY_GROUP = 4242, 4343, 4444
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="devshim drops to nobody only when it runs as root")


def node(path: Path, gid: int, major: int = 1, minor: int = 3) -> Path:
    """A character device node (by default the number of /dev/null) owned by group ``gid``."""
    os.mknod(path, stat.S_IFCHR | 0o660, os.makedev(major, minor))
    os.chown(path, 0, gid)
    return path


@pytest.fixture
def devices(tmp_path: Path) -> Path:
    """Device nodes an operator's policy names, and one beside them that it does not:
    fpga0, fpga1 (group 4242: given), shared0 (group 4343, which also owns mem, a node the floor
    guards: withheld), rooted0 (group 0: withheld), shy0 (group 4444, which also owns other0,
    which the policy does not name: withheld)."""
    folder = tmp_path / "dev"
    folder.mkdir()
    try:
        node(folder / "fpga0", FPGA_GROUP)
    except PermissionError:
        pytest.skip("needs CAP_MKNOD to make device nodes")
    node(folder / "fpga1", FPGA_GROUP, minor=5)
    node(folder / "shared0", SHARED_GROUP)
    node(folder / "mem", SHARED_GROUP, minor=1)  # c 1:1, physical memory: the floor's device.memory
    node(folder / "rooted0", 0)
    node(folder / "shy0", SHY_GROUP)
    node(folder / "other0", SHY_GROUP)
    return folder


def entry(devices: Path | None = None, **settings: Any) -> dict[str, Any]:
    declared = [f"{devices}/fpga*", f"{devices}/shared*", f"{devices}/rooted*", f"{devices}/shy*"]
    return {
        "name": "hardened",
        "command": [NOBODY_PYTHON or sys.executable, str(HARDENED)],
        "resources": [WHO],
        "policy": {"envs": ["WHO"], "device_nodes": declared if devices else []},
        **settings,
    }


@needs_root
def test_the_default_is_nobody_with_the_declared_device_groups_that_give_no_more(devices: Path) -> None:
    """Only group 4242 is given: each other group of a declared node would open more than the
    policy allows, and says so."""
    found = identity(DriverSettings.model_validate(entry(devices)), devices_dir=str(devices))
    assert found == Identity(
        DEFAULT_UID,
        DEFAULT_UID,
        (FPGA_GROUP, DEFAULT_UID),
        default=True,
        withheld=(
            f"group 0 of {devices}/rooted0: root's group",
            f"group {SHARED_GROUP} of {devices}/shared0: it also owns {devices}/mem, which the policy "
            "does not allow",
            f"group {SHY_GROUP} of {devices}/shy0: it also owns {devices}/other0, which the policy does "
            "not allow",
        ),
    )


@needs_root
def test_a_node_of_a_type_the_policy_does_not_allow_gives_no_group(devices: Path) -> None:
    """The policy allows block devices only: the character nodes its globs match are not its,
    so none of their groups is given."""
    settings = entry(devices)
    settings["policy"]["device_node_types"] = ["block"]
    found = identity(DriverSettings.model_validate(settings), devices_dir=str(devices))
    assert found is not None and found.groups == (DEFAULT_UID,)


@needs_root
@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        pytest.param({"user": "root"}, None, id="root: devshim's ids, untouched"),
        pytest.param({"user": 0, "group": 4242}, (None, 4242, (4242,)), id="root with a group"),
        pytest.param({"group": 4242}, (DEFAULT_UID, 4242, (4242,)), id="a group alone: nobody too"),
    ],
)
def test_only_root_as_configured_keeps_root(
    settings: dict[str, Any], expected: tuple[Any, ...] | None
) -> None:
    found = identity(DriverSettings.model_validate(entry(**settings)))
    assert (found and (found.uid, found.gid, found.groups)) == expected


@needs_nobody
async def test_a_driver_runs_as_nobody_with_its_device_groups_by_default(
    plugin_dir: Path, state_dir: Path, devices: Path
) -> None:
    """End to end: the driver's own ids, as it lists them, are nobody's and group 4242's, and
    devshim's policy still grants the node it declared."""
    # The nodes stay root's; the walk that finds their groups is devshim's, as root. identity()
    # walks /dev as well as the globs' folders, so the scratch nodes are found from their glob.
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        drivers=[entry(devices)],
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings):
        session = await kubelet.wait_for_plugin(WHO, timeout=WAIT_S)
        ids = [d.id for d in await session.wait_for_list(timeout=WAIT_S)]
    assert ids[:3] == ["uid-65534", "gid-65534", f"groups-{FPGA_GROUP}_{DEFAULT_UID}"]


@needs_root
async def test_a_driver_nobody_cannot_run_fails_naming_its_user_and_the_setting(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """A driver in a folder only root may enter (pytest's): the failure says it runs as nobody by
    default and which setting changes that, in /status."""
    program = tmp_path / "private" / "driver.py"
    program.parent.mkdir(mode=0o700)
    program.write_text("print('never runs')\n")
    program.chmod(0o755)
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        drivers=[{
            "name": "private", "command": [str(program)], "resources": ["example.com/private"],
            "restart": {"max_start_failures": 1000, "backoff_initial_s": 0.01, "backoff_max_s": 0.05},
        }],
    )  # fmt: skip
    async with Shim(settings) as shim:
        async with asyncio.timeout(WAIT_S):
            while not shim.status()["drivers"]["private"]["last_failure"]:
                await asyncio.sleep(0.02)
        shown = shim.status()["drivers"]["private"]["last_failure"]
    assert "Permission denied" in shown, shown
    assert "it runs as uid 65534, gid 65534, groups 65534, unprivileged by default" in shown, shown
    assert "set drivers[private].user" in shown, shown


@needs_root
def test_check_config_shows_who_each_driver_runs_as(tmp_path: Path, devices: Path) -> None:
    """check-config, on the node: the default user with its device groups and each withheld
    group with why; a driver set to root says so."""
    import yaml

    config = tmp_path / "devshim.yaml"
    legacy = {"name": "legacy", "command": ["x"], "resources": ["example.com/legacy"], "user": "root"}
    config.write_text(yaml.safe_dump({"drivers": [entry(devices), legacy]}))
    done = subprocess.run(
        [sys.executable, "-m", "shim", "check-config", str(config)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        f"  runs as uid 65534, gid 65534, groups {FPGA_GROUP},65534: unprivileged by default "
        "(drivers[].user changes it)" in lines
    ), done.stdout
    assert f"  withheld: group 0 of {devices}/rooted0: root's group" in lines
    assert "  runs as root, as its user setting says" in lines

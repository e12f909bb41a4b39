"""docs/sdk.md, executed: each example driver the guide shows runs behind a real devshim with the
fake kubelet and does what the guide says, and the code the guide shows is the example's file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.facts import KUBELET_PRESTART_DEADLINE_S
from shim.settings import DriverTimeouts, RestartPolicy, Settings
from tests.support import ROOT
from tests.support.shim_fixtures import logged

GUIDE = ROOT / "docs" / "sdk.md"
EXAMPLES = ROOT / "adapters" / "examples"
# A shown example: the link to its file, then its code.
SHOWN = re.compile(r"^\[`(adapters/examples/\w+\.py)`\]\(\.\./\1\):\n\n```python\n(.*?)^```$", re.M | re.S)


def guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


def block(info: str) -> str:
    """The guide's one fenced block whose info string is ``info``."""
    (found,) = re.findall(rf"^```{re.escape(info)}\n(.*?)^```$", guide(), re.M | re.S)
    return str(found)


def health(devices: Any) -> dict[str, str]:
    return {d.id: d.health for d in devices}


def write(path: Path, text: str) -> None:
    """Replaced whole, so a driver polling the file never reads it half written."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_text(text)
    os.replace(staged, path)


@asynccontextmanager
async def served(
    plugin_dir: Path,
    state_dir: Path,
    example: str,
    *resources: str,
    name: str,
    env: dict[str, str] | None = None,
    **declared: Any,
) -> AsyncIterator[tuple[Shim, list[PluginSession]]]:
    """devshim running ``example`` as driver ``name`` with ``env`` (its whole environment), serving
    ``resources`` and granting what ``declared`` (policy, resource_policies) allows, and the fake
    kubelet's session of each of ``resources`` once its first list arrived."""
    command = [sys.executable, str(EXAMPLES / example)]
    driver = {
        "name": name,
        "user": "root",
        "command": command,
        "env": env or {},
        "resources": list(resources),
        **declared,
    }
    settings = Settings.load(
        device_plugins_dir=plugin_dir, state_dir=state_dir, register_backoff_max_s=0.5, drivers=[driver]
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings) as shim:
        sessions = [await kubelet.wait_for_plugin(r, timeout=20) for r in resources]
        for session in sessions:
            await session.wait_for_list()
        yield shim, sessions


def test_the_guide_shows_each_example_file_as_it_is() -> None:
    """Every Python block of the guide follows the link to its file and equals it, character for
    character; every guide example in adapters/examples/ is shown."""
    shown = dict(SHOWN.findall(guide()))
    assert guide().count("```python") == len(shown), "a Python block without its file's link"
    for path, code in shown.items():
        assert (ROOT / path).read_text(encoding="utf-8") == code, f"{path} differs from docs/sdk.md"
    examples = {f"adapters/examples/{p.name}" for p in EXAMPLES.glob("guide_*.py")}
    assert set(shown) == {"adapters/examples/python_minimal.py", *examples}


def test_the_figures_the_guide_gives_are_devshims_own() -> None:
    """The kubelet's PreStartContainer deadline, the preferred_allocation timeout and the flood
    bound, as the guide states them, are the values devshim has."""
    text = " ".join(guide().split())
    (kubelet_s,) = re.findall(r"\(the kubelet allows it (\d+) s\)", text)
    (preference_s,) = re.findall(r"takes longer than (\d+) s", text)
    (flood,) = re.findall(r"More than ([\d,]+) notifications a second", text)
    assert float(kubelet_s) == KUBELET_PRESTART_DEADLINE_S
    assert float(preference_s) == DriverTimeouts().preferred_allocation_s
    assert int(flood.replace(",", "")) == RestartPolicy().max_notifications_per_s


def test_the_drivers_entry_the_guide_shows_is_a_valid_config(plugin_dir: Path) -> None:
    """The guide's YAML is a drivers[] entry devshim's settings accept as written: it lists the
    resource guide_notifications.py serves (a driver never chooses its own)."""
    settings = Settings.load(device_plugins_dir=plugin_dir, **yaml.safe_load(block("yaml")))
    (driver,) = settings.drivers
    assert driver.env == {"SLOTS_DIR": "/run/slots"}
    assert driver.resources == ["example.com/slot"]


def test_trying_the_smallest_driver_by_hand_with_files(tmp_path: Path) -> None:
    """The guide's "Trying it by hand": requests.jsonl in, answers.jsonl out, both regular files;
    the driver exits 0 leaving exactly the answers the guide shows."""
    requests, answers = tmp_path / "requests.jsonl", tmp_path / "answers.jsonl"
    requests.write_text(block("jsonl requests.jsonl"))
    with requests.open("rb") as stdin, answers.open("wb") as stdout:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "python_minimal.py")],
            stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, timeout=30, cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()

    def by_id(text: str) -> dict[int, Any]:
        messages = [json.loads(line) for line in text.splitlines()]
        return {m["id"]: m for m in messages}

    assert by_id(answers.read_text()) == by_id(block("jsonl answers.jsonl"))


def test_the_warning_the_guide_shows_is_the_one_the_sdk_writes() -> None:
    """The smallest driver given a prestart method and no flag: the SDK writes the guide's warning
    to stderr when initialized."""
    (warning,) = block("text").splitlines()
    program = (EXAMPLES / "python_minimal.py").read_text().replace(
        "\n\nif __name__", "\n    async def prestart(self, resource: str, device_ids: list[str]) -> None:\n"
        "        pass\n\n\nif __name__",
    )  # fmt: skip
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocol_version": "1.0.0"}}
    done = subprocess.run(
        [sys.executable, "-c", program],
        input=json.dumps(initialize) + "\n", capture_output=True, text=True, timeout=30, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert warning in done.stderr.splitlines()


async def test_the_smallest_driver_serves_its_fans_to_the_kubelet(plugin_dir: Path, state_dir: Path) -> None:
    """python_minimal.py behind devshim: four healthy fans, and a pod's grant names its fans."""
    minimal = "python_minimal.py"
    policy = {"envs": ["FANS"]}
    async with served(plugin_dir, state_dir, minimal, "example.com/fan", name="fans", policy=policy) as (
        _,
        [fans],
    ):
        assert health(fans.latest) == dict.fromkeys(["fan0", "fan1", "fan2", "fan3"], "Healthy")
        ids, grant = await fans.admit(2)
    assert grant.envs == {"FANS": ",".join(ids)}


async def test_notifications_plug_break_and_pull_slots(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """guide_notifications.py: a slot file created is a device plugged in, "fault" in it turns it
    Unhealthy, removing it takes it off the node; each change is logged under the driver's name."""
    slots = tmp_path / "slots"
    slots.mkdir()
    for slot in ("slot0", "slot1"):
        write(slots / slot, "ok")
    env = {"SLOTS_DIR": str(slots), "SLOTS_POLL_S": "0.05"}
    with logged("INFO") as log:
        async with served(
            plugin_dir, state_dir, "guide_notifications.py", "example.com/slot", name="slots", env=env
        ) as (_, [session]):
            assert health(session.latest) == {"slot0": "Healthy", "slot1": "Healthy"}
            write(slots / "slot2", "ok")
            await session.wait_for_list(lambda ds: len(ds) == 3)
            write(slots / "slot1", "fault")
            listed = await session.wait_for_list(lambda ds: health(ds).get("slot1") == "Unhealthy")
            assert health(listed) == {"slot0": "Healthy", "slot1": "Unhealthy", "slot2": "Healthy"}
            (slots / "slot0").unlink()
            await session.wait_for_list(lambda ds: sorted(health(ds)) == ["slot1", "slot2"])
    shown = re.findall(r"`(driver 'slots': [^`]+)`", guide())
    assert len(shown) == 2 and set(shown) <= set(log), (shown, log)
    assert "driver 'slots': plugged [], pulled ['slot0']" in log


async def test_background_health_follows_the_temperature_with_hysteresis(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """guide_health.py: a GPU at 95 °C turns Unhealthy at the kubelet, stays so at 87 °C, and is
    Healthy again at 80 °C."""
    sensors = tmp_path / "hwmon"
    sensors.mkdir()
    write(sensors / "gpu0", "45000")
    write(sensors / "gpu1", "50000")
    env = {"THERMAL_DIR": str(sensors), "THERMAL_POLL_S": "0.05"}
    async with served(
        plugin_dir, state_dir, "guide_health.py", "example.com/gpu", name="thermal", env=env
    ) as (_, [gpus]):
        assert health(gpus.latest) == {"gpu0": "Healthy", "gpu1": "Healthy"}
        write(sensors / "gpu1", "95000")
        await gpus.wait_for_list(lambda ds: health(ds)["gpu1"] == "Unhealthy")
        # gpu1 is written first and probed last: the probe that sees gpu0 hot sees gpu1 at 87 °C.
        write(sensors / "gpu1", "87000")
        write(sensors / "gpu0", "95000")
        listed = await gpus.wait_for_list(lambda ds: health(ds)["gpu0"] == "Unhealthy")
        assert health(listed)["gpu1"] == "Unhealthy"
        write(sensors / "gpu1", "80000")
        await gpus.wait_for_list(lambda ds: health(ds)["gpu1"] == "Healthy")


async def test_declared_grants_need_no_call_and_per_call_grants_one_each(
    plugin_dir: Path, state_dir: Path
) -> None:
    """guide_grants.py: disks are allocated from their declared grants, merged, without asking the
    driver; virtual functions ask it once per Allocate, and each container gets its own VLAN."""
    # Each resource's grants declared on their own: a disk's env and CDI device, a VF's two envs.
    policies = {
        "example.com/disk": {"envs": ["DISKS"], "cdi_kinds": ["example.com/disk"]},
        "example.com/vf": {"envs": ["VFS", "VLAN"]},
    }
    async with served(
        plugin_dir,
        state_dir,
        "guide_grants.py",
        "example.com/disk",
        "example.com/vf",
        name="storage",
        resource_policies=policies,
    ) as (shim, [disks, vfs]):
        disk_grant = await disks.allocate(["disk1", "disk0"])
        assert "allocate" not in shim.drivers[0].calls
        vf_grants = await vfs.allocate_containers([["vf0"], ["vf1", "vf2"]])
        assert shim.drivers[0].calls["allocate"].ok == 1
    assert disk_grant.envs == {"DISKS": "disk1,disk0"}
    assert disk_grant.cdi_devices == ("example.com/disk=disk1", "example.com/disk=disk0")
    assert [g.envs for g in vf_grants] == [{"VFS": "vf0", "VLAN": "100"}, {"VFS": "vf1,vf2", "VLAN": "101"}]


def preference_table() -> list[tuple[int, list[str], list[str]]]:
    """The rows of the guide's table of size, must include and preferred."""
    table = guide().split("| size | must include | preferred |\n|---|---|---|\n", 1)[1].split("\n\n", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    assert rows and all(len(row) == 3 for row in rows), table

    def ids(cell: str) -> list[str]:
        return cell.split(", ") if cell else []

    return [(int(size), ids(must), ids(chosen)) for size, must, chosen in rows]


async def test_preferred_allocation_keeps_a_containers_devices_on_one_numa_node(
    plugin_dir: Path, state_dir: Path
) -> None:
    """guide_numa.py: GetPreferredAllocation answers each row of the guide's table, and the kubelet
    then admits a pod of three to node 1 and a pod of two to node 0."""
    everything = ["acc0", "acc1", "acc2", "acc3", "acc4"]
    policy = {"envs": ["ACCELERATORS"]}
    async with served(
        plugin_dir, state_dir, "guide_numa.py", "example.com/acc", name="acc", policy=policy
    ) as (_, [accs]):
        assert [d.numa_nodes for d in accs.latest] == [(0,), (0,), (1,), (1,), (1,)]
        for size, must_include, preferred in preference_table():
            assert await accs.preferred_allocation(everything, must_include, size) == preferred
        first, _ = await accs.admit(3)
        second, _ = await accs.admit(2)
    assert (sorted(first), sorted(second)) == (["acc2", "acc3", "acc4"], ["acc0", "acc1"])

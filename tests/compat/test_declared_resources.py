"""A driver serves only the resources its operator declared for it (issue 41, item 2).

Without ``drivers[].resources`` devshim does not start: `devshim check-config`, `devshim run
--config` and `devshim run --driver` without --driver-resource each exit 2 naming the setting.
A driver that offers a resource outside its declaration never gets it registered with the fake
kubelet, at initialize or later, while its declared one is served: in particular it cannot
re-register ``vendor.com/gpu`` (attack 4, first half), whether another driver's declaration
holds that name or a device plugin outside devshim has it registered with the kubelet.

devshim runs in-process with the fake kubelet and real driver subprocesses
(tests/support/drivers/claiming.py declares whatever it is told to, at ``initialize`` and in a
``resources_changed`` per SIGUSR1), except where the command itself is what is judged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.compat.fakekubelet.records import HEALTHY, DeviceState
from shim.driverhost import DriverHost
from shim.ops.series import REGISTRY
from shim.settings import Settings
from shim.status import render_status
from tests.support import DRIVERS
from tests.support.devshim_process import DEVSHIM
from tests.support.scripted import PluginScript
from tests.support.scripted_plugin import ScriptedPlugin
from tests.support.waiting import until

CLAIMING = DRIVERS / "claiming.py"
GPU = "vendor.com/gpu"
OWN = "example.com/own"
MARK = "example.com/own-mark"
WAIT_S = 20.0
NOT_SET = "drivers[sim].resources is not set: list the resources this driver may serve"


def claiming(
    name: str, offered: list[str], declared: list[str], steps: list[list[str]] | None = None
) -> dict[str, Any]:
    """A claiming.py driver named ``name`` offering ``offered`` at initialize (then each of
    ``steps`` per SIGUSR1), with device IDs ``<name>-0``, ``<name>-1``; ``declared`` is its
    ``resources`` setting, and its grants' one variable (CLAIMED) is declared."""
    env = {
        "CLAIM_RESOURCES": json.dumps(offered),
        "CLAIM_STEPS": json.dumps(steps or []),
        "CLAIM_PREFIX": f"{name}-",
    }
    return {
        "name": name,
        "user": "root",
        "command": [sys.executable, str(CLAIMING)],
        "env": env,
        "resources": declared,
        "policy": {"envs": ["CLAIMED"]},
    }


@asynccontextmanager
async def serving(
    plugin_dir: Path, state_dir: Path, drivers: list[dict[str, Any]], kubelet: FakeKubelet | None = None
) -> AsyncIterator[tuple[FakeKubelet, Shim]]:
    """devshim serving ``drivers`` with the fake kubelet (``kubelet`` if one runs already)."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir, state_dir=state_dir, register_backoff_max_s=0.5, drivers=drivers
    )
    if kubelet is not None:
        async with Shim(settings) as shim:
            yield kubelet, shim
        return
    async with FakeKubelet(plugin_dir) as started, Shim(settings) as shim:
        yield started, shim


def host(shim: Shim, name: str) -> DriverHost:
    return next(d for d in shim.drivers if d.name == name)


def refused_claims(driver: str, resource: str) -> float:
    labels = {"driver": driver, "resource": resource}
    return REGISTRY.get_sample_value("devshim_driver_refused_claims_total", labels) or 0.0


def registrations(kubelet: FakeKubelet, resource: str) -> int:
    return sum(r.resource_name == resource for r in kubelet.registrations)


async def listed(kubelet: FakeKubelet, resource: str, ids: list[str]) -> None:
    session = await kubelet.wait_for_plugin(resource, timeout=WAIT_S)
    await session.wait_for_list(lambda devices: [d.id for d in devices] == ids, timeout=WAIT_S)


# --- without a declaration devshim does not start ------------------------------------------------


def devshim_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEVSHIM, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("how", ["check-config", "run --config", "run --driver"])
def test_a_driver_without_resources_is_a_start_up_error_naming_the_setting(
    tmp_path: Path, plugin_dir: Path, how: str
) -> None:
    """Each way of giving devshim a driver refuses one that does not say what it may serve: exit
    2, one message naming drivers[sim].resources and how to set it, no traceback, nothing served."""
    command = [sys.executable, str(CLAIMING)]
    config = tmp_path / "devshim.yaml"
    config.write_text(json.dumps({"drivers": [{"name": "sim", "user": "root", "command": command}]}))
    serve_in = ["--device-plugins-dir", str(plugin_dir), "--state-dir", str(tmp_path / "state")]
    args = {
        "check-config": ["check-config", str(config)],
        "run --config": ["run", "--config", str(config), *serve_in],
        "run --driver": [
            "run",
            "--driver",
            f"sim={subprocess.list2cmdline(command)}",
            "--driver-user",
            "sim=root",
            *serve_in,
        ],
    }[how]
    result = devshim_command(*args)
    assert result.returncode == 2, result
    assert NOT_SET in result.stderr
    assert "(on the command line: --driver-resource sim=RESOURCE)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(plugin_dir.iterdir())  # no socket was ever made


def test_driver_resource_flags_are_checked_as_the_file_is() -> None:
    """--driver-resource for a --driver that is not given is a usage error naming it; the
    declaration's own checks apply to what the flags build (resource names, as in a file)."""
    unknown = devshim_command("run", "--driver", "sim=x", "--driver-resource", "other=example.com/x")
    assert unknown.returncode == 2 and "no --driver is named 'other'" in unknown.stderr
    bad = devshim_command("run", "--driver", "sim=x", "--driver-resource", "sim=not-a-resource-name")
    assert bad.returncode == 2 and "drivers[0].resources" in bad.stderr and "Traceback" not in bad.stderr


def test_resource_policies_must_name_declared_resources(tmp_path: Path) -> None:
    """A policy for a resource the driver may not serve is a mistake the file is refused for."""
    config = tmp_path / "devshim.yaml"
    driver = {
        "name": "sim",
        "user": "root",
        "command": ["x"],
        "resources": [OWN],
        "resource_policies": {GPU: {}},
    }
    config.write_text(json.dumps({"drivers": [driver]}))
    result = devshim_command("check-config", str(config))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"resource_policies names {GPU}, not in this driver's resources" in result.stderr


# --- an undeclared resource is never registered --------------------------------------------------


async def test_a_resource_outside_the_declaration_is_never_registered_while_the_declared_one_is(
    plugin_dir: Path, state_dir: Path, warnings: list[str]
) -> None:
    """The driver declares OWN and MARK but offers vendor.com/gpu too, at initialize and again in
    resources_changed (with MARK, so MARK's registration shows the message was applied): each
    time the log says why it is refused and the metric counts it; the kubelet never sees a
    registration of it; OWN is served with the driver's devices."""
    before = refused_claims("vendor", "other")
    driver = claiming("vendor", [OWN, GPU], [OWN, MARK], steps=[[OWN, GPU, MARK]])
    async with serving(plugin_dir, state_dir, [driver]) as (kubelet, shim):
        await listed(kubelet, OWN, ["vendor-0", "vendor-1"])
        why = (
            f"driver 'vendor': refused a resource it may not serve: {GPU} is not in drivers[vendor].resources"
        )
        assert why in warnings
        assert host(shim, "vendor").refused == {GPU: f"{GPU} is not in drivers[vendor].resources"}
        assert refused_claims("vendor", "other") == before + 1

        process = host(shim, "vendor").process
        assert process is not None
        os.kill(process.pid, signal.SIGUSR1)
        await listed(kubelet, MARK, ["vendor-0", "vendor-1"])
        assert refused_claims("vendor", "other") == before + 2
        assert warnings.count(why) == 2

        assert registrations(kubelet, GPU) == 0 and GPU not in shim.served
        assert sorted(host(shim, "vendor").sources) == [OWN, MARK]
        shown = shim.status()["drivers"]["vendor"]
        assert shown["resources"] == [OWN, MARK]
        assert shown["refused"] == {GPU: f"{GPU} is not in drivers[vendor].resources"}
        assert f"refused {GPU}: {GPU} is not in drivers[vendor].resources" in render_status(shim.status())
        assert (await kubelet.plugin(OWN).allocate(["vendor-0"])).envs == {"CLAIMED": "vendor-0"}


async def test_a_driver_cannot_take_a_name_another_driver_declared_even_before_that_one_serves_it(
    plugin_dir: Path, state_dir: Path, warnings: list[str]
) -> None:
    """Attack 4, first half: the thief starts first and offers vendor.com/gpu, which the gpu
    driver's declaration holds though the gpu driver does not offer it yet. The name is
    reserved from the start: the thief is refused naming the owner, and the kubelet never sees
    vendor.com/gpu registered; the thief's declared resource is served."""
    thief = claiming("thief", [OWN, GPU], [OWN])
    gpu = claiming("gpu", [], [GPU])
    before = refused_claims("thief", GPU)
    async with serving(plugin_dir, state_dir, [thief, gpu]) as (kubelet, shim):
        await listed(kubelet, OWN, ["thief-0", "thief-1"])
        assert host(shim, "thief").refused == {GPU: f"{GPU} belongs to driver 'gpu'"}
        assert (
            f"driver 'thief': refused a resource it may not serve: {GPU} belongs to driver 'gpu'" in warnings
        )
        assert refused_claims("thief", GPU) == before + 1
        await until(lambda: host(shim, "gpu").status == "up", "the gpu driver is up", WAIT_S)
        assert not host(shim, "gpu").sources
        assert registrations(kubelet, GPU) == 0 and GPU not in shim.served


GPU_DEVICES = [DeviceState("gpu-0", HEALTHY), DeviceState("gpu-1", HEALTHY)]


async def test_a_driver_cannot_re_register_a_resource_a_plugin_outside_devshim_serves(
    plugin_dir: Path, state_dir: Path, warnings: list[str]
) -> None:
    """Attack 4, first half, against a real vendor: vendor.com/gpu is registered with the kubelet
    by its own device plugin. A devshim driver declared for OWN offers vendor.com/gpu too; a
    second Register of the name would make the kubelet drop the vendor's plugin for devshim's.
    devshim never sends it: the kubelet's one registration of vendor.com/gpu stays the vendor's,
    its stream open with the vendor's devices."""
    async with (
        FakeKubelet(plugin_dir) as kubelet,
        ScriptedPlugin(plugin_dir / "vendor.sock", PluginScript(devices=GPU_DEVICES)) as vendor,
    ):
        await vendor.register(kubelet.kubelet_socket, GPU)
        session = await kubelet.wait_for_plugin(GPU, timeout=WAIT_S)
        await session.wait_for_list(lambda devices: list(devices) == GPU_DEVICES, timeout=WAIT_S)
        driver = claiming("vendor", [OWN, GPU], [OWN])
        async with serving(plugin_dir, state_dir, [driver], kubelet) as (_, shim):
            await listed(kubelet, OWN, ["vendor-0", "vendor-1"])
            assert host(shim, "vendor").refused == {GPU: f"{GPU} is not in drivers[vendor].resources"}
            assert registrations(kubelet, GPU) == 1
            assert kubelet.plugin(GPU) is session and not session.stream_ended.is_set()
            assert all(list(devices) == GPU_DEVICES for devices in session.lists), session.lists

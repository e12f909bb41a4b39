"""The devfs driver (adapters/devfs) as a program, spoken to as devshim would."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.driver_process import DriverProcess

DEVFS = [sys.executable, "-m", "adapters.devfs"]
SERIAL = "example.com/serial"
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="os.mknod of a char device needs root")


@asynccontextmanager
async def devfs(
    tmp_path: Path, groups: list[dict[str, Any]], **settings: Any
) -> AsyncIterator[DriverProcess]:
    """The driver with ``groups``, initialized; polling is fast so a missed event cannot stall a test."""
    config = tmp_path / "devfs.json"
    config.write_text(json.dumps({"groups": groups, "poll_interval_s": 0.2, **settings}))
    driver = await DriverProcess.start(*DEVFS, "--config", str(config))
    try:
        await driver.initialize()
        yield driver
    finally:
        await driver.kill()


async def listed(driver: DriverProcess, resource: str = SERIAL) -> list[dict[str, Any]]:
    response = await driver.request(1, "list_devices", {"resource": resource})
    devices: list[dict[str, Any]] = response["result"].get("devices", [])
    return devices


async def changed(driver: DriverProcess) -> list[dict[str, Any]]:
    """The next devices_changed notification's full list."""
    params = (await driver.wait_for(method="devices_changed"))["params"]
    devices: list[dict[str, Any]] = params.get("devices", [])
    return devices


def summary(devices: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(d["id"], d.get("health", "HEALTHY")) for d in devices]


async def test_real_null_zero_and_full_are_listed_with_their_declared_grants(tmp_path: Path) -> None:
    """A glob over /dev/{null,zero,full} lists each node once, with a device-node grant at the
    same path in the container and the configured permissions."""
    group = {"resource": SERIAL, "paths": ["/dev/null", "/dev/zer[o]", "/dev/full"], "permissions": "r"}
    async with devfs(tmp_path, [group]) as driver:
        devices = await listed(driver)
    assert summary(devices) == [("null", "HEALTHY"), ("zero", "HEALTHY"), ("full", "HEALTHY")]
    assert devices[1]["grant"] == {
        "device_nodes": [{"container_path": "/dev/zero", "host_path": "/dev/zero", "permissions": "r"}]
    }
    assert "numa_nodes" not in devices[0]


async def test_a_glob_matching_nothing_lists_no_devices(tmp_path: Path) -> None:
    """An absent device is an empty list, not an error: the node simply has none."""
    async with devfs(tmp_path, [{"resource": SERIAL, "paths": [str(tmp_path / "nope" / "tty*")]}]) as driver:
        assert await listed(driver) == []


async def test_a_shared_node_is_listed_count_times_with_one_grant_each(tmp_path: Path) -> None:
    """count 3 makes one node three devices <name>-0..2, all granting the same node, with
    container_path, mounts and CDI names expanded."""
    (tmp_path / "fuse").touch()
    group = {
        "resource": "example.com/fuse",
        "paths": [str(tmp_path / "fuse")],
        "count": 3,
        "container_path": "/dev/{name}",
        "mounts": [{"container_path": "/etc/x", "host_path": "/etc/x", "read_only": True}],
        "cdi_devices": ["example.com/fuse={id}"],
    }
    async with devfs(tmp_path, [group]) as driver:
        devices = await listed(driver, "example.com/fuse")
    assert [d["id"] for d in devices] == ["fuse-0", "fuse-1", "fuse-2"]
    assert devices[2]["grant"] == {
        "mounts": [{"container_path": "/etc/x", "host_path": "/etc/x", "read_only": True}],
        "device_nodes": [
            {"container_path": "/dev/fuse", "host_path": str(tmp_path / "fuse"), "permissions": "rw"}
        ],
        "cdi_devices": ["example.com/fuse=fuse-2"],
    }


@pytest.mark.parametrize("watch_mode", ["inotify", "poll"])
async def test_nodes_plugged_and_unplugged_while_watching_send_the_full_new_list(
    tmp_path: Path, watch_mode: str
) -> None:
    """A node created in a watched directory arrives as devices_changed with the whole list; an
    unallocated node removed disappears from the next list at once; by inotify or by polling."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "ttyUSB0").touch()
    groups = [{"resource": SERIAL, "paths": [str(dev / "ttyUSB*")]}]
    async with devfs(tmp_path, groups, watch_mode=watch_mode) as driver:
        assert summary(await listed(driver)) == [("ttyUSB0", "HEALTHY")]
        (dev / "ttyUSB1").touch()
        assert summary(await changed(driver)) == [("ttyUSB0", "HEALTHY"), ("ttyUSB1", "HEALTHY")]
        (dev / "ttyUSB0").unlink()
        assert summary(await changed(driver)) == [("ttyUSB1", "HEALTHY")]


async def test_a_vanished_node_in_use_is_unhealthy_until_deallocated(tmp_path: Path) -> None:
    """A node that goes away while a container holds it stays listed Unhealthy, so the kubelet
    sees the failure; deallocate then drops it."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "ttyUSB0").touch()
    (dev / "ttyUSB1").touch()
    async with devfs(tmp_path, [{"resource": SERIAL, "paths": [str(dev / "ttyUSB*")]}]) as driver:
        await listed(driver)
        await driver.request(2, "prestart", {"resource": SERIAL, "device_ids": ["ttyUSB0"]})
        (dev / "ttyUSB0").unlink()
        assert summary(await changed(driver)) == [("ttyUSB1", "HEALTHY"), ("ttyUSB0", "UNHEALTHY")]
        await driver.request(3, "deallocate", {"resource": SERIAL, "device_ids": ["ttyUSB0"]})
        assert summary(await changed(driver)) == [("ttyUSB1", "HEALTHY")]


async def test_a_vanished_node_never_deallocated_is_dropped_after_the_grace(tmp_path: Path) -> None:
    """Without a deallocate (say, a kubelet without PodResources) vanished_grace_s ends it."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "kvm").touch()
    group = {"resource": SERIAL, "paths": [str(dev / "kvm")]}
    async with devfs(tmp_path, [group], vanished_grace_s=0.5) as driver:
        await listed(driver)
        await driver.request(2, "prestart", {"resource": SERIAL, "device_ids": ["kvm"]})
        (dev / "kvm").unlink()
        assert summary(await changed(driver)) == [("kvm", "UNHEALTHY")]
        assert await changed(driver) == []


def fake_usb_tty(sysfs: Path, dev: Path, minor: int, vendor: str, numa: str | None) -> None:
    """A char node 188:<minor> and sysfs laid out as the kernel does for a USB serial adapter:
    /sys/dev/char/188:<minor> links to the tty, whose fourth parent holds idVendor/idProduct."""
    usb = sysfs / "devices" / f"usb{minor}" / "1-1"
    tty = usb / "1-1:1.0" / f"ttyUSB{minor}" / "tty" / f"ttyUSB{minor}"
    (tty / "device").mkdir(parents=True)
    (usb / "idVendor").write_text(vendor + "\n")
    (usb / "idProduct").write_text("6001\n")
    if numa is not None:
        (tty / "device" / "numa_node").write_text(numa + "\n")
    (sysfs / "dev" / "char").mkdir(parents=True, exist_ok=True)
    (sysfs / "dev" / "char" / f"188:{minor}").symlink_to(tty)
    os.mknod(dev / f"ttyUSB{minor}", 0o600 | stat.S_IFCHR, os.makedev(188, minor))


@ROOT_ONLY
async def test_sysfs_attributes_select_nodes_and_give_their_numa_node(tmp_path: Path) -> None:
    """Only the adapter whose idVendor/idProduct match is listed; its numa_node is reported,
    and -1 (no affinity) or a missing file gives none."""
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    dev.mkdir()
    fake_usb_tty(sysfs, dev, 0, "0403", "1")
    fake_usb_tty(sysfs, dev, 1, "067b", "0")
    fake_usb_tty(sysfs, dev, 2, "0403", "-1")
    fake_usb_tty(sysfs, dev, 3, "0403", None)
    group = {
        "resource": SERIAL,
        "paths": [str(dev / "ttyUSB*")],
        "sysfs": {"idVendor": "0403", "idProduct": "6001"},
    }
    async with devfs(tmp_path, [group], sysfs_root=str(sysfs)) as driver:
        devices = await listed(driver)
    assert [(d["id"], d.get("numa_nodes")) for d in devices] == [
        ("ttyUSB0", [1]),
        ("ttyUSB2", None),
        ("ttyUSB3", None),
    ]


async def test_an_invalid_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    """A misspelt key and a bad resource name are reported by field, and the driver never starts."""
    config = tmp_path / "bad.yaml"
    config.write_text("groups:\n  - resource: serial\n    paths: [/dev/ttyUSB*]\n    cout: 2\n")
    driver = await DriverProcess.start(*DEVFS, "--config", str(config))
    assert await driver.finish() == 2
    assert "groups[0].resource" in driver.stderr and "groups[0].cout" in driver.stderr

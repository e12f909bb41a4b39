"""A driver in another language (adapters/examples/node) behind devshim, seen from the fake kubelet."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.settings import Settings
from tests.support.toolchains import toolchain

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "adapters" / "examples" / "node" / "driver.js"
NODE = shutil.which("node")
RESOURCE = "example.com/node"
# What its Allocate grants: an env and /dev/null as /dev/node/<id>.
POLICY = {"envs": ["EXAMPLE_NODE_DEVICES"], "device_nodes": ["/dev/null"]}


@pytest.fixture(autouse=True, scope="module")
def _node_present() -> None:
    toolchain("node", "the Node.js example driver (adapters/examples/node)")


def node_settings(plugin_dir: Path, state_dir: Path, **env: str) -> Settings:
    assert NODE is not None
    return Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        drivers=[
            {
                "name": "node-example",
                "user": "root",
                "command": [NODE, str(DRIVER)],
                "env": env,
                "resources": [RESOURCE],
                "policy": POLICY,
            }
        ],
    )


@pytest.fixture
async def node(plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet) -> AsyncIterator[PluginSession]:
    settings = node_settings(
        plugin_dir, state_dir, NODE_DRIVER_DEVICES="n-a,n-b,n-c,n-d", NODE_DRIVER_PREFERRED_DELAY_MS="1500"
    )
    async with Shim(settings):
        session = await kubelet.wait_for_plugin(RESOURCE)
        await session.wait_for_list()
        yield session


async def test_the_node_drivers_devices_reach_the_kubelet_with_numa_nodes(node: PluginSession) -> None:
    """IDs from the driver's environment, NUMA node by position, all Healthy."""
    listed = node.latest
    assert [(d.id, d.health, d.numa_nodes) for d in listed] == [
        ("n-a", "Healthy", (0,)),
        ("n-b", "Healthy", (1,)),
        ("n-c", "Healthy", (0,)),
        ("n-d", "Healthy", (1,)),
    ]
    assert node.options.get_preferred_allocation_available
    assert not node.options.pre_start_required


async def test_allocate_is_answered_per_call_by_the_node_driver(node: PluginSession) -> None:
    """The grant the kubelet receives is the one the Node.js driver computed for these IDs."""
    grant = await node.allocate(["n-b", "n-d"])
    assert grant.envs == {"EXAMPLE_NODE_DEVICES": "n-b,n-d"}
    assert grant.device_nodes == (("/dev/node/n-b", "/dev/null", "rw"), ("/dev/node/n-d", "/dev/null", "rw"))
    assert grant.cdi_devices == ()  # a CDI name would need a spec on the node


async def test_a_slow_preferred_allocation_does_not_stall_allocate(node: PluginSession) -> None:
    """With the driver taking 1.5 s per preference, an Allocate sent meanwhile finishes first."""
    order: list[str] = []

    async def prefer() -> None:
        await node.preferred_allocation(["n-a", "n-b", "n-c"], ["n-c"], 2)
        order.append("preferred")

    async def allocate() -> None:
        await asyncio.sleep(0.1)
        await node.allocate(["n-a"])
        order.append("allocate")

    async with asyncio.timeout(10):
        await asyncio.gather(prefer(), allocate())
    assert order == ["allocate", "preferred"]


async def test_the_drivers_preference_reaches_the_kubelet(node: PluginSession) -> None:
    """Must-include first, then the rest in order, exactly allocation_size IDs."""
    assert await node.preferred_allocation(["n-a", "n-b", "n-c"], ["n-c"], 2) == ["n-c", "n-a"]


async def test_an_unknown_device_is_refused_before_the_driver_is_asked(node: PluginSession) -> None:
    """devshim validates against the list, so the kubelet gets INVALID_ARGUMENT naming the ID."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await node.allocate(["n-z"])
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "'n-z'" in (info.value.details() or "")


async def test_a_health_change_from_the_driver_arrives_as_a_full_list(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """The driver's health_changed delta becomes a complete new list with that device Unhealthy."""
    settings = node_settings(
        plugin_dir, state_dir, NODE_DRIVER_DEVICES="h-0,h-1", NODE_DRIVER_UNHEALTHY_AFTER_MS="300"
    )
    async with Shim(settings):
        session = await kubelet.wait_for_plugin(RESOURCE)
        listed = await session.wait_for_list(lambda ds: any(not d.healthy for d in ds))
    assert [(d.id, d.health) for d in listed] == [("h-0", "Healthy"), ("h-1", "Unhealthy")]


async def test_a_killed_driver_is_restarted_and_its_devices_return(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """Killing the driver never drops a device: the next list has every one Unhealthy; the
    supervisor restarts it and the devices come back Healthy and allocatable."""
    settings = node_settings(plugin_dir, state_dir, NODE_DRIVER_DEVICES="k-0,k-1")
    async with Shim(settings) as shim:
        session = await kubelet.wait_for_plugin(RESOURCE)
        await session.wait_for_list()
        process = shim.drivers[0].process
        assert process is not None
        process.kill()
        down = await session.wait_for_list(lambda ds: all(not d.healthy for d in ds))
        assert [d.id for d in down] == ["k-0", "k-1"]
        back = await session.wait_for_list(lambda ds: all(d.healthy for d in ds))
        assert [d.id for d in back] == ["k-0", "k-1"]
        assert shim.drivers[0].process is not process
        assert (await session.allocate(["k-0"])).envs == {"EXAMPLE_NODE_DEVICES": "k-0"}

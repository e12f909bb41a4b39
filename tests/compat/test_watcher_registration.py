"""Registration through the kubelet's plugin watcher (registration: watcher)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import CleanupMode, FakeKubelet
from shim.compat.fakekubelet.pluginregistration import RegistrationClient
from shim.compat.fakekubelet.records import WATCHER
from shim.node import sockets
from tests.support.shim_fixtures import FOO, settings_for
from tests.support.unix import short_temp_dir


@pytest.fixture
def registry() -> Iterator[Path]:
    with short_temp_dir("ds-reg-") as path:
        yield path


@asynccontextmanager
async def watcher_mode(plugin_dir: Path, registry: Path) -> AsyncIterator[tuple[FakeKubelet, Shim]]:
    settings = settings_for(
        plugin_dir, {FOO: {"count": 3}}, registration="watcher", plugins_registry_dir=registry
    )
    async with FakeKubelet(plugin_dir, plugins_registry=registry) as kubelet, Shim(settings) as shim:
        yield kubelet, shim


async def test_the_plugin_watcher_finds_registers_and_lists_the_resource(
    plugin_dir: Path, registry: Path
) -> None:
    """GetInfo from the registration socket, DevicePlugin on that same socket (empty endpoint),
    NotifyRegistrationStatus(true) reaching devshim; no Register call and no socket in
    device-plugins/, whose cleanup it would not survive."""
    async with watcher_mode(plugin_dir, registry) as (kubelet, shim):
        record = await kubelet.wait_for_registration(FOO)
        assert record.ok and record.path == WATCHER and record.version == "v1beta1"
        session = await kubelet.wait_for_plugin(FOO)
        assert [d.id for d in await session.wait_for_list()] == ["dev0", "dev1", "dev2"]
        assert (await session.allocate(["dev1"])) is not None
        await kubelet.wait_until(lambda: bool(kubelet.notifications), what="a registration status")
        assert [(n.registered, n.error) for n in kubelet.notifications][-1] == (True, "")
        assert shim.served[FOO].endpoint.watcher_status == "registered"
        assert sorted(p.name for p in plugin_dir.iterdir()) == ["kubelet.sock"]
        assert shim.served[FOO].endpoint.socket_path.exists()


async def test_after_a_kubelet_restart_the_watcher_finds_devshim_again(
    plugin_dir: Path, registry: Path
) -> None:
    """The restarted kubelet re-walks plugins_registry and reconnects to the same socket;
    devshim keeps serving it (the old ListAndWatch ending is not a reason to re-create it)."""
    async with watcher_mode(plugin_dir, registry) as (kubelet, shim):
        await kubelet.wait_for_registration(FOO)
        before = sockets.identity(shim.served[FOO].endpoint.socket_path)
        await kubelet.restart(CleanupMode.KUBELET_1_25)
        record = await kubelet.wait_for_registration(FOO, count=2)
        assert record.ok and record.path == WATCHER
        session = await kubelet.wait_for_plugin(FOO)
        assert len(await session.wait_for_list()) == 3
        assert sockets.identity(shim.served[FOO].endpoint.socket_path) == before


async def test_a_refusal_from_the_watcher_is_answered_with_a_fresh_socket(
    plugin_dir: Path, registry: Path
) -> None:
    """NotifyRegistrationStatus(false) is logged and kept as the endpoint's status, and devshim
    offers a new socket (the watcher only acts on new ones), which the kubelet registers."""
    async with watcher_mode(plugin_dir, registry) as (kubelet, shim):
        await kubelet.wait_for_registration(FOO)
        before = sockets.identity(shim.served[FOO].endpoint.socket_path)
        client = RegistrationClient(shim.served[FOO].endpoint.socket_path)
        await client.connect()
        await client.notify(False, "simulated refusal", timeout=5)
        await client.close()
        assert shim.served[FOO].endpoint.watcher_status == "refused: simulated refusal"
        record = await kubelet.wait_for_registration(FOO, count=2, timeout=10)
        assert record.ok
        assert sockets.identity(shim.served[FOO].endpoint.socket_path) != before

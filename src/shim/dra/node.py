"""Every DRA driver on this node: its pool published (publisher.py) and its kubelet plugin
(plugin/: registration, NodePrepareResources, health), fed by the served resources it names;
which resource owns each device name of the pool is one PoolOwners (ownership.py) all three ask,
holding a resource's names while it is not served (its last list, or its driver's inventory)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loguru import logger

from shim.cdi import SpecDir
from shim.core.api import ClaimResource
from shim.dra.attached import AttachedStore
from shim.dra.binding import ClaimBinder
from shim.dra.checkpoint import Checkpoint
from shim.dra.claims import ClaimRef
from shim.dra.health import PoolHealth
from shim.dra.kube import ClaimReader
from shim.dra.ownership import Offer, PoolOwners
from shim.dra.plugin.common import DraService, PluginStatus
from shim.dra.plugin.server import DraPluginServer, socket_paths
from shim.dra.preparer import ClaimPreparer
from shim.dra.publisher import PoolPublisher
from shim.inventory import InventoryStore
from shim.model import Device
from shim.settings import DraDriverSettings, Settings

# A pool is first published once every resource it names is served (each driver has listed its
# devices, or devshim's inventory has them), or after this long with what is served by then.
FIRST_POOL_WAIT_S = 30.0


def _inventories(settings: Settings) -> Callable[[str], Sequence[Device]]:
    """Each resource's devices as its configured driver's inventory last saved them (what its
    driver host restores at start): what ownership holds for a resource not served yet."""
    stores = {
        resource: InventoryStore.of_driver(settings.state_dir, driver.name)
        for driver in settings.drivers
        for resource in driver.resources or ()
    }

    def last_known(resource: str) -> Sequence[Device]:
        store = stores.get(resource)  # none for a static resource: its devices are always served
        saved = store.load(resource) if store is not None else None
        return saved.devices if saved is not None else ()

    return last_known


class DraDrivers:
    """Per configured DRA driver, a PoolPublisher and a DraPluginServer, fed by the resources it
    names while they are served (bootstrap.Shim calls ``follow``/``unfollow`` as it adds and
    removes them)."""

    def __init__(
        self,
        settings: Settings,
        services: Callable[[], Mapping[str, ClaimResource]],
        in_use: Callable[[], Mapping[str, set[str]]],
        in_use_known: asyncio.Event,
    ) -> None:
        """``in_use``: the devices PodResources last listed as held by containers, per resource;
        ``in_use_known`` is set once it was first asked (core/holds.py)."""
        dra = settings.dra
        node = dra.node_name
        assert node is not None  # DraSettings fills it in, or refuses to load
        self._services = services
        self._in_use, self._in_use_known = in_use, in_use_known
        last_known = _inventories(settings)
        self._owners = {
            driver.name: PoolOwners(driver.resources, services, last_known) for driver in dra.drivers
        }
        self._publishers = {
            driver.name: PoolPublisher(
                driver.name, node, self._devices_of(driver), kubeconfig=dra.kubeconfig,
                bindings=driver.binding_conditions,
            )
            for driver in dra.drivers
        }  # fmt: skip
        self._pool_known = {driver.name: asyncio.Event() for driver in dra.drivers}
        self._binders = {
            driver.name: ClaimBinder(
                driver.name, node, self._owners[driver.name], services,
                kubeconfig=dra.kubeconfig, pool_known=self._pool_known[driver.name],
                store=AttachedStore(settings.state_dir, driver.name),
            )
            for driver in dra.drivers
            if driver.binding_conditions
        }  # fmt: skip
        specs = SpecDir(dra.cdi_dir)
        self._plugins: dict[str, DraPluginServer] = {}
        self._by_driver: dict[str, ClaimPreparer] = {}
        for driver in dra.drivers:
            read = ClaimReader(dra.kubeconfig)

            async def read_claim(ref: ClaimRef, read: ClaimReader = read) -> dict[str, Any]:
                return await read(ref.namespace, ref.name)

            registration, socket = socket_paths(driver.name, settings.plugins_registry_dir, dra.plugins_dir)
            status = PluginStatus(driver.name, str(socket), str(registration))
            owners = self._owners[driver.name]
            preparer = ClaimPreparer(
                driver.name, node, owners, services, read_claim, specs,
                Checkpoint(settings.state_dir, driver.name),
            )  # fmt: skip
            self._by_driver[driver.name] = preparer
            service = DraService(preparer, PoolHealth(owners, services), status)
            self._plugins[driver.name] = DraPluginServer(
                service, settings.plugins_registry_dir, dra.plugins_dir, settings.socket
            )
        self._pool_of = {r: self._publishers[d.name] for d in dra.drivers for r in d.resources}
        self._preparers = {r: self._by_driver[d.name] for d in dra.drivers for r in d.resources}
        self._following: dict[str, asyncio.Task[None]] = {}
        self._running: list[asyncio.Task[None]] = []
        self._waited = False
        self._complete: set[str] = set()  # DRA drivers whose pool has been whole once

    def _devices_of(self, driver: DraDriverSettings) -> Callable[[], Offer | None]:
        owners = self._owners[driver.name]

        def devices() -> Offer | None:
            served = self._services()
            if driver.name not in self._complete:
                if not self._waited and any(r not in served for r in driver.resources):
                    return None  # a driver still starting: publishing now would drop its devices
                if not self._waited and not self._in_use_known.is_set():
                    return None  # what containers hold is not known yet: it may not be published
                self._complete.add(driver.name)  # from now on, what is served is the pool
                self._pool_known[driver.name].set()
            ownership = owners()
            lists = {r: served[r].dra_devices for r in driver.resources if r in served}
            return Offer(ownership.published(lists), ownership.problem())

        return devices

    def start(self) -> None:
        for preparer in self._by_driver.values():  # before the kubelet can start a container
            preparer.restore_specs()  # that needs a lost spec
        self._running = [
            asyncio.create_task(self._when_in_use_known(), name="dra:in-use"),
            *(asyncio.create_task(p.run(), name=f"dra:{name}") for name, p in self._publishers.items()),
            *(asyncio.create_task(p.run(), name=f"dra-plugin:{name}") for name, p in self._plugins.items()),
            *(asyncio.create_task(b.run(), name=f"dra-binding:{name}") for name, b in self._binders.items()),
        ]
        asyncio.get_running_loop().call_later(FIRST_POOL_WAIT_S, self._stop_waiting)

    async def _when_in_use_known(self) -> None:
        await self._in_use_known.wait()
        for publisher in self._publishers.values():
            publisher.changed()

    def _stop_waiting(self) -> None:
        self._waited = True
        for publisher in self._publishers.values():
            publisher.changed()

    async def follow(self, resource: str, service: ClaimResource) -> None:
        """Publish ``resource``'s devices in its driver's pool, holding each for one API at a
        time (core/holds.py) from now: call it before the device plugin serves them."""
        publisher = self._pool_of.get(resource)
        if publisher is None:
            return
        preparer = self._preparers[resource]
        await service.serve_dra(
            preparer.holding(resource), self._in_use().get(resource, ()), preparer.sharing(resource)
        )

        async def follow() -> None:
            async for _ in service.watch_dra():
                publisher.changed()

        self._following[resource] = asyncio.create_task(follow(), name=f"dra-follow:{resource}")

    def unfollow(self, resource: str) -> None:
        task = self._following.pop(resource, None)
        if task is not None:
            task.cancel()
            logger.info("DRA: {} is no longer served: its devices leave the pool", resource)
            self._pool_of[resource].changed()

    async def stop(self) -> None:
        """The published slices stay: the devices are still on the node, and a restarted devshim
        takes the pool up where it was (the kubelet removes a node's slices when it needs to)."""
        tasks = [*self._following.values(), *self._running]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        self._following.clear()
        self._running = []
        for preparer in self._by_driver.values():
            with contextlib.suppress(OSError):  # said as it happened; the file holds it all the same
                await preparer.flush()

    def status(self) -> dict[str, Any]:
        plugins = {name: dataclasses.asdict(p.service.status) for name, p in self._plugins.items()}
        binders = {name: {"binding": dataclasses.asdict(b.status)} for name, b in self._binders.items()}
        return {
            name: dataclasses.asdict(p.status) | {"kubelet": plugins[name]} | binders.get(name, {})
            for name, p in sorted(self._publishers.items())
        }

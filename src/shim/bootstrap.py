"""The composition root: the one place the object graph is built from settings."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from loguru import logger

from shim import __version__
from shim.cdi import ShippedSpecs
from shim.core.resource import ResourceService
from shim.deviceplugin.api import ApiVersion
from shim.deviceplugin.deallocation import DeallocationEmulator
from shim.deviceplugin.endpoint import PluginEndpoint
from shim.errors import ClaimRefused, SpecsRefused
from shim.model import CdiSpec
from shim.names import check_extended_resource_name
from shim.node.dirwatch import DirWatcher
from shim.node.handover import Handover
from shim.policy import GrantPolicy
from shim.settings import INSTANCE_ID_DIGITS, DriverSettings, Settings, socket_prefix
from shim.slices import sliced
from shim.sources import DeviceSource, StaticSource
from shim.status import driver_status, resource_status

if TYPE_CHECKING:
    from shim.dra.node import DraDrivers
    from shim.driverhost import DriverHost

# Settings a running devshim cannot change: a reload warns and keeps them until a restart.
_RESTART_ONLY = (
    "device_plugins_dir", "state_dir", "deallocation", "registration", "api_versions", "plugins_registry_dir",
    "watch_mode", "poll_interval_s", "register_backoff_max_s", "prestart_timeout_s", "http", "socket", "dra",
    "cdi_dir", "node_configs",
)  # fmt: skip


# The owner of the resources configured under `resources:`. Driver names cannot contain a space,
# so this never names a driver.
STATIC_CONFIG = "static config"


def describe_owner(owner: str) -> str:
    return "the static config (resources:)" if owner == STATIC_CONFIG else f"driver {owner!r}"


@dataclass
class Served:
    """One resource being served: its core service, its kubelet endpoint, the endpoint's task."""

    service: ResourceService
    endpoint: PluginEndpoint
    task: asyncio.Task[None]


# Each kubelet API version's module (the one place its generated code is imported), newest first:
# classic registration offers them in this order. Only the configured ones are imported.
API_MODULES = {"v1beta2": "shim.deviceplugin.v1beta2", "v1beta1": "shim.deviceplugin.v1beta1"}


def kubelet_apis(names: Collection[str]) -> list[ApiVersion]:
    """The configured API versions' modules, newest first."""
    return [importlib.import_module(module).API for name, module in API_MODULES.items() if name in names]


class Shim:
    """Every configured resource and driver, served and registered, until ``stop``.

    Static resources come from settings; drivers add and remove theirs at run
    time through ``add_resource``/``remove_resource`` (the ResourceRegistry).

    Every resource has one owner: the static config, or the driver that lists it in its
    ``drivers[].resources``. Only the owner may serve it and only the owner's removal applies, so
    a driver can neither take over nor remove another source's resource.

    ``policies`` sees each resource's grant policy before it is used: `devshim compat` notes what
    a driver grants there, to suggest its declaration.
    """

    def __init__(
        self,
        settings: Settings,
        sources: Mapping[str, DeviceSource] | None = None,
        *,
        policies: Callable[[GrantPolicy], GrantPolicy] | None = None,
    ) -> None:
        self.settings = settings
        self.policies = policies or (lambda policy: policy)
        given = dict(sources or {})
        self._static = [
            (
                r.name,
                r.socket_name,
                given.pop(r.name) if r.name in given else StaticSource.from_settings(r.static),
                r.grant_policy(),
            )
            for r in settings.resources
        ]
        if given:
            raise ValueError(f"sources given for unconfigured resources: {', '.join(given)}")
        self.drivers = [self._driver_host(d) for d in settings.drivers]
        # Names this instance's sockets: a second devshim on the node (a rolling update) takes
        # resources over from us instead of clashing (node/handover.py).
        self.instance = secrets.token_hex(INSTANCE_ID_DIGITS // 2)
        self.watcher_mode = settings.registration == "watcher"
        # Offered newest first: classic registration tries them in this order.
        self.apis = kubelet_apis(settings.api_versions)
        # The directory our sockets live in: a deleted one is re-created.
        socket_dir = settings.plugins_registry_dir if self.watcher_mode else settings.device_plugins_dir
        self.watcher = DirWatcher(socket_dir, settings.watch_mode, settings.poll_interval_s)
        self.served: dict[str, Served] = {}
        # Resources of a DRA pool with device_plugin false: no endpoint, the kubelet's DRA
        # manager alone asks for their devices (docs/dra.md, "From the device plugin to DRA").
        self.dra_only: dict[str, ResourceService] = {}
        # Resource name -> owner (a driver's name or STATIC_CONFIG), from a claim until removal.
        self.owners: dict[str, str] = {}
        self.deallocation = DeallocationEmulator(settings.deallocation, lambda: self.services)
        self._deallocating: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.dra: DraDrivers | None = None
        if settings.dra.drivers:
            from shim.dra.node import DraDrivers  # brings the Kubernetes client: only for DRA

            found = self.deallocation  # what containers hold, for the pools (core/holds.py)
            self.dra = DraDrivers(settings, lambda: self.services, lambda: found.in_use, found.first_list)

    async def start(self) -> None:
        self.settings.device_plugins_dir.mkdir(parents=True, exist_ok=True)
        if self.watcher_mode:
            self.settings.plugins_registry_dir.mkdir(parents=True, exist_ok=True)
        self._tasks.append(asyncio.create_task(self.watcher.run(), name="dirwatch"))
        self._start_deallocation()
        for name, socket_name, source, policy in self._static:
            await self.add_resource(name, source, socket_name, policy=policy)
        for driver in self.drivers:
            with logger.contextualize(driver=driver.name):
                await driver.start()
        if self.dra is not None:  # after every source's first list, so the first pool is whole
            self.dra.start()

    async def add_resource(
        self,
        name: str,
        source: DeviceSource,
        socket_name: str | None = None,
        *,
        policy: GrantPolicy | None = None,
        driver: str | None = None,
    ) -> None:
        # Every caller checked the name; this guards the socket and file names made from it.
        check_extended_resource_name(name)
        owner = driver if driver is not None else STATIC_CONFIG
        holder = self.owners.setdefault(name, owner)
        if holder != owner or name in self.served or name in self.dra_only:
            logger.error(
                "{} is already served by {}; ignoring {} for it",
                name,
                describe_owner(holder),
                describe_owner(owner),
            )
            return
        # Only a driver can act on deallocate, and only a running emulator reads what is tracked;
        # in a DRA pool, a device the device plugin holds is withdrawn from DRA until released.
        tracked = self.settings.deallocation.enabled and (driver is not None or self._in_dra_pool(name))
        service = ResourceService(
            name,
            source,
            prestart_timeout_s=self.settings.prestart_timeout_s,
            on_allocated=self.deallocation.tracker.allocated if tracked else None,
            on_released=self.deallocation.tracker.released if tracked else None,
            policy=self.policies(policy or GrantPolicy(name)),
            driver=driver,
        )
        if service.policy.floor.lifted:
            logger.warning(
                "{}: {} lifts the floor's rule(s) {}: its grants may hold what they guard",
                name, service.policy.where, ", ".join(service.policy.floor.lifted),
            )  # fmt: skip
        if self.dra is not None and self._dra_only(name):
            with logger.contextualize(resource=name):
                await service.start()
                await self.dra.follow(name, service)
            self.dra_only[name] = service
            logger.info("{}: served through DRA only (no device plugin endpoint)", name)
            return
        handover = None
        if socket_name is None:  # ours to name: per instance, handed over between instances
            handover = Handover(self.watcher.directory, socket_prefix(name), self.instance)
            socket_name = handover.socket_name
        endpoint = PluginEndpoint(
            service,
            self.apis,
            handover=handover,
            plugin_dir=self.settings.device_plugins_dir,
            socket_name=socket_name,
            backoff_max_s=self.settings.register_backoff_max_s,
            plugins_registry=self.settings.plugins_registry_dir if self.watcher_mode else None,
            socket=self.settings.socket,
        )
        endpoint.preflight()
        # Every log line of this resource's tasks (they copy the context) names it.
        with logger.contextualize(resource=name):
            await service.start()
            if self.dra is not None:  # before the kubelet can allocate what a claim holds
                await self.dra.follow(name, service)
            task = asyncio.create_task(endpoint.run(), name=f"endpoint:{name}")
        self.watcher.subscribe(endpoint.check_files)
        self.served[name] = Served(service, endpoint, task)

    def options_changed(self, name: str) -> None:
        """``name``'s capabilities changed: its endpoint registers again, so the kubelet reads
        the options they make (DRA reads them per call: nothing to tell it)."""
        if (served := self.served.get(name)) is not None:
            served.endpoint.options_changed()

    def claim(self, name: str, driver: DriverSettings) -> None:
        """Make ``driver`` the owner of ``name``, or raise ClaimRefused naming who has it."""
        holder = self.owners.get(name) or self._configured_owner(name)
        if holder is not None and holder != driver.name:
            raise ClaimRefused(f"{name} belongs to {describe_owner(holder)}", describe_owner(holder))
        # None only where the settings were read to learn what a driver declares (`devshim compat`).
        if driver.resources is not None and name not in driver.resources:
            raise ClaimRefused(f"{name} is not in drivers[{driver.name}].resources", None)
        self.owners[name] = driver.name

    def _configured_owner(self, name: str) -> str | None:
        """The owner the settings give ``name`` (a static resource, or a driver's list), if any."""
        if any(r.name == name for r in self.settings.resources):
            return STATIC_CONFIG
        return next((d.name for d in self.settings.drivers if name in (d.resources or ())), None)

    async def remove_resource(self, name: str, owner: str | None = None) -> None:
        """Stop serving ``name``; with ``owner`` given, only if it is that owner's."""
        holder = self.owners.get(name)
        if owner is not None and holder != owner:
            if holder is not None:
                logger.warning(
                    "{} belongs to {}; not removing it for {}",
                    name,
                    describe_owner(holder),
                    describe_owner(owner),
                )
            return
        self.owners.pop(name, None)
        if (only := self.dra_only.pop(name, None)) is not None:
            if self.dra is not None:
                self.dra.unfollow(name)
            await only.stop()
            logger.info("{}: no longer served", name)
            return
        served = self.served.pop(name, None)
        if served is None:
            return
        if self.dra is not None:
            self.dra.unfollow(name)
        self.watcher.unsubscribe(served.endpoint.check_files)
        served.task.cancel()
        await asyncio.gather(served.task, return_exceptions=True)
        await served.endpoint.close()
        await served.service.stop()
        logger.info("{}: no longer served", name)

    async def stop(self) -> None:
        # DRA publishing stops first: a driver or resource stopped while the publisher still ran
        # would take its devices out of the node's ResourceSlices, and a rolling update would
        # empty the pool that the scheduler allocates from (its slices stay as they are).
        if self.dra is not None:
            await self.dra.stop()
        for driver in self.drivers:
            await driver.stop()
        for name in [*self.served, *self.dra_only]:
            await self.remove_resource(name)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def reload(self, new: Settings) -> None:
        """Apply a changed config: drivers and static resources whose settings changed (or that
        were added or removed) are restarted (started, stopped); the rest keep running untouched.
        Settings that only take effect at start are kept, with a warning."""
        kept = {k for k in _RESTART_ONLY if getattr(new, k) != getattr(self.settings, k)}
        for key in sorted(kept):
            logger.warning("reload: {} changed; it takes effect when devshim restarts", key)
        old_drivers = {d.name: d for d in self.drivers}
        wanted = {d.name: d for d in new.drivers}
        for name, host in old_drivers.items():
            if wanted.get(name) != host.settings:
                await self._stop_driver(host)
            if name not in wanted and self.settings.cdi_dir is not None:
                # Gone from the config: its CDI specs go too (a driver still configured replaces
                # its own at its next initialize; none are removed when devshim only stops).
                await asyncio.to_thread(ShippedSpecs(self.settings.cdi_dir, name).replace, ())
        old_static = {r.name: r for r in self.settings.resources}
        for resource in self.settings.resources:
            if resource not in new.resources:
                await self.remove_resource(resource.name, STATIC_CONFIG)
        self.settings = self.settings.model_copy(
            update={
                "drivers": new.drivers,
                "resources": new.resources,
                "log_level": new.log_level,
                "log_format": new.log_format,
            }  # fmt: skip
        )
        for resource in new.resources:
            if old_static.get(resource.name) != resource:
                await self.add_resource(
                    resource.name,
                    StaticSource.from_settings(resource.static),
                    resource.socket_name,
                    policy=resource.grant_policy(),
                )
        for name, driver_settings in wanted.items():
            if old_drivers.get(name) is None or old_drivers[name].settings != driver_settings:
                host = self._driver_host(driver_settings)
                self.drivers.append(host)
                with logger.contextualize(driver=name):
                    await host.start()
        self._start_deallocation()
        logger.info("reload: {} drivers, {} static resources", len(self.drivers), len(new.resources))

    def _in_dra_pool(self, resource: str) -> bool:
        return any(resource in d.resources for d in self.settings.dra.drivers)

    def _dra_only(self, resource: str) -> bool:
        return any(resource in d.resources and not d.device_plugin for d in self.settings.dra.drivers)

    def _start_deallocation(self) -> None:
        """Only drivers can act on deallocate (static devices need no release), and a DRA pool
        needs to know when the device plugin's containers free a device: the emulation runs
        once there is one, at start or when a reload adds the first."""
        if not self.settings.deallocation.enabled:
            self.deallocation.first_list.set()  # no List to wait for (a DRA-only pool's case)
            return
        if self._deallocating is not None:
            return
        if not self.drivers and not self.settings.dra.drivers:
            self.deallocation.status = "not running: no drivers to tell (static devices need no release)"
            return
        self._deallocating = asyncio.create_task(self.deallocation.run(), name="deallocation")
        self._tasks.append(self._deallocating)

    def _driver_host(self, driver: DriverSettings) -> DriverHost:
        # Imported here: a node with static resources only does without the driver side.
        from shim.driverhost import DriverHost
        from shim.inventory import InventoryStore

        store = InventoryStore.of_driver(self.settings.state_dir, driver.name)
        return DriverHost(driver, _DriverResources(self, driver), store)

    async def _stop_driver(self, host: DriverHost) -> None:
        self.drivers.remove(host)
        await host.stop()
        for resource in list(host.sources):
            await self.remove_resource(resource, host.name)
        # Claims it made but never served (its run ended between claim and serve).
        for name in [n for n, owner in self.owners.items() if owner == host.name]:
            await self.remove_resource(name, host.name)

    def ready(self) -> tuple[bool, str]:
        """Ready when every served resource is registered with the kubelet; else which are not."""
        waiting = sorted(name for name, served in self.served.items() if not served.endpoint.registered)
        if not self.served and not self.dra_only:
            return False, "no resource is served yet"
        if waiting:
            return False, "not registered: " + ", ".join(waiting)
        return True, "every resource is registered"

    def status(self) -> dict[str, Any]:
        """What this devshim is doing, as `devshim status` and /status show it."""
        return {
            "version": __version__,
            "registration": self.settings.registration,
            "api_versions": list(self.settings.api_versions),
            "ready": self.ready()[1],
            "resources": {
                name: resource_status(
                    served.endpoint,
                    served.service.devices,
                    served.service.holds.status() if served.service.holds is not None else None,
                )
                for name, served in sorted(self.served.items())
            }
            | {
                name: resource_status(None, service.devices)
                for name, service in sorted(self.dra_only.items())
            },
            "drivers": {driver.name: driver_status(driver) for driver in self.drivers},
            "deallocation": self.deallocation.status if self.settings.deallocation.enabled else "disabled",
            "dra": self.dra.status() if self.dra is not None else "not configured",
        }

    @property
    def services(self) -> dict[str, ResourceService]:
        return {name: served.service for name, served in self.served.items()} | self.dra_only

    async def wait(self) -> None:
        """Until cancelled, or until a background part fails (raised here)."""
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()

    async def __aenter__(self) -> Shim:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


@dataclass
class _DriverResources:
    """The ResourceRegistry one driver sees: its resources are served under its grant policy."""

    shim: Shim
    driver: DriverSettings

    def claim(self, name: str) -> None:
        self.shim.claim(name, self.driver)

    async def add_resource(self, name: str, source: DeviceSource) -> None:
        self.shim.claim(name, self.driver)
        policy = self.driver.grant_policy(name)
        await self.shim.add_resource(name, source, policy=policy, driver=self.driver.name)

    async def remove_resource(self, name: str) -> None:
        await self.shim.remove_resource(name, self.driver.name)

    def options_changed(self, name: str) -> None:
        self.shim.options_changed(name)

    async def ship_cdi_specs(self, specs: Sequence[CdiSpec]) -> None:
        folder = self.shim.settings.cdi_dir
        if folder is None:
            if specs:
                kinds = ", ".join(s.kind for s in specs)
                raise SpecsRefused(
                    f"the driver ships CDI specs ({kinds}) but cdi_dir is not set: set it to a CDI "
                    "folder of the container runtime (e.g. /var/run/cdi, mounted read-write)"
                )
            return
        # Up to MAX_CDI_SPEC_DEVICES checks (a host path each looked up): in slices, as long
        # work on the loop is, so other resources' calls are answered meanwhile.
        async with sliced("driver CDI specs checked") as slices:
            for spec in specs:
                policy = self.shim.policies(self.driver.spec_policy(spec.kind))
                for device in spec.devices:  # granting kind=name grants these edits
                    policy.check(
                        dataclasses.replace(device.edits, cdi_devices=(f"{spec.kind}={device.name}",))
                    )
                    await slices.due()
        shipped = ShippedSpecs(folder, self.driver.name)
        written = await asyncio.to_thread(shipped.replace, specs)  # file I/O: off the loop
        if written:
            logger.info("driver {!r}: CDI specs written: {}", self.driver.name, ", ".join(map(str, written)))

"""The legacy adapter as a devshim driver: legacy plugins' resources, devices and RPCs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import TypeVar

import grpc
from loguru import logger

from shim.compat.fakekubelet import records
from shim.compat.fakekubelet.api import PreferredRequest
from shim.facts import PRESTART_TIMEOUT_S
from shim.sdk import Driver, DriverError, ErrorCode, types

from .kubelet import LegacyPlugin, PrivateKubelet
from .process import LegacyProcess

# A legacy plugin's first list, awaited before answering initialize (bounded, so devshim's 30 s
# initialize deadline is never at risk); later ones arrive by notifications.
FIRST_LIST_S = 10.0
# How long list_devices waits for the first list of a resource named by --resource (--list-wait):
# below devshim's default list_devices_s (30 s). The protocol has no "not known yet", and an empty
# answer would remove the devices devshim keeps, Unhealthy, through our restart.
LIST_WAIT_S = 20.0
RPC_TIMEOUT_S = 20.0
T = TypeVar("T")


def device_from_record(state: records.DeviceState, reachable: bool) -> types.Device:
    healthy = reachable and state.health == records.HEALTHY
    return types.Device(
        id=state.id,
        health=types.Health.HEALTHY if healthy else types.Health.UNHEALTHY,
        numa_nodes=list(state.numa_nodes),
    )


# The optional methods a resource declares: (preferred_allocation, prestart).
Capabilities = tuple[bool, bool]


def _capabilities(resource: types.Resource) -> Capabilities:
    return (resource.preferred_allocation, resource.prestart)


def grant_from_record(grant: records.Grant) -> types.Grant:
    return types.Grant(
        envs=dict(grant.envs),
        mounts=[types.Mount(container_path=c, host_path=h, read_only=ro) for c, h, ro in grant.mounts],
        device_nodes=[
            types.DeviceNode(container_path=c, host_path=h, permissions=p) for c, h, p in grant.device_nodes
        ],
        annotations=dict(grant.annotations),
        cdi_devices=list(grant.cdi_devices),
    )


class LegacyAdapter(Driver):
    name = "devshim-legacy"

    def __init__(
        self,
        kubelet_dir: Path,
        process: LegacyProcess | None,
        socket_mode: int,
        allowed_resources: Iterable[str] = (),
        list_wait_s: float = LIST_WAIT_S,
    ) -> None:
        # Named by --resource: declared from the start, so that a restarted adapter keeps them
        # (devshim removes what a driver no longer declares) while its plugin comes back.
        self._named = tuple(dict.fromkeys(allowed_resources))
        self.kubelet = PrivateKubelet(kubelet_dir, self._on_list, self._on_gone, socket_mode, self._named)
        self.process = process
        self._list_wait_s = list_wait_s
        self._devices: dict[str, tuple[records.DeviceState, ...]] = {}
        self._reachable: dict[str, bool] = {}
        self._listed: dict[str, asyncio.Event] = {}  # set at each resource's first list
        self._any_listed = asyncio.Event()
        self._announced: dict[str, Capabilities] = {}  # what devshim was last told we serve
        self._live = False  # notifications only once devshim has our initialize answer

    # --- life cycle ----------------------------------------------------------

    async def on_initialize(self, params: types.InitializeParams) -> None:
        await self.kubelet.start()
        if self.process is not None:
            await self.process.start()
        # With names, each one's list (its options come before it); without, any plugin's.
        waits = [self._first_list(name).wait() for name in self._named] or [self._any_listed.wait()]
        try:
            async with asyncio.timeout(min(FIRST_LIST_S, self._list_wait_s)):
                await asyncio.gather(*waits)
        except TimeoutError:
            if self._named:
                missing = ", ".join(n for n in self._named if n not in self._devices)
                logger.warning(
                    "{}: no list from the legacy plugin within {:g} s; declared, its devices listed once it"
                    " sends one", missing, min(FIRST_LIST_S, self._list_wait_s),
                )  # fmt: skip
            else:
                logger.warning(
                    "no legacy plugin listed devices within {:g} s; serving it once it does",
                    min(FIRST_LIST_S, self._list_wait_s),
                )
        self._announced = {r.name: _capabilities(r) for r in self.resources()}
        # Our answer is written as soon as this returns; go live right after it.
        asyncio.get_running_loop().call_soon(setattr, self, "_live", True)

    async def on_shutdown(self) -> None:
        if self.process is not None:
            await self.process.stop()
        await self.kubelet.stop()

    # --- what the legacy plugins tell the kubelet ----------------------------------

    async def _on_list(self, plugin: LegacyPlugin, devices: tuple[records.DeviceState, ...]) -> None:
        self._devices[plugin.resource] = devices
        self._reachable[plugin.resource] = True
        self._first_list(plugin.resource).set()
        self._any_listed.set()
        await self._publish(plugin.resource)

    async def _on_gone(self, plugin: LegacyPlugin) -> None:
        # Broken, not gone: keep its devices listed, Unhealthy, until it registers again.
        if self.kubelet.plugins.get(plugin.resource) is plugin:
            self._reachable[plugin.resource] = False
            await self._publish(plugin.resource)

    def _first_list(self, resource: str) -> asyncio.Event:
        return self._listed.setdefault(resource, asyncio.Event())

    async def _publish(self, resource: str) -> None:
        if not self._live or resource not in self._devices:
            return
        if self._announced.get(resource) != _capabilities(self._resource(resource)):
            # New to devshim, or declared before its plugin's options were known: devshim
            # takes the new set, then lists the resource's devices itself.
            self._announced = {r.name: _capabilities(r) for r in self.resources()}
            await self.resources_changed()
        else:
            await self.devices_changed(resource, self._listing(resource))

    # --- the driver protocol ------------------------------------------------------

    def resources(self) -> list[types.Resource]:
        names = self._named or [name for name in self.kubelet.plugins if name in self._devices]
        return [self._resource(name) for name in names]

    def _resource(self, name: str) -> types.Resource:
        plugin = self.kubelet.plugins.get(name)
        options = plugin.options if plugin is not None else records.PluginOptions()
        return types.Resource(
            name=name,
            preferred_allocation=options.get_preferred_allocation_available,
            prestart=options.pre_start_required,
        )

    async def list_devices(self, resource: str) -> list[types.Device]:
        if resource not in self._devices:
            # Declared before its plugin listed anything: wait for that list. An empty answer
            # would make devshim drop the devices it keeps Unhealthy through our restart; an
            # error leaves them so (the start fails, and devshim starts us again).
            try:
                async with asyncio.timeout(self._list_wait_s):
                    await self._first_list(resource).wait()
            except TimeoutError:
                why = (
                    "registered but listed no devices"
                    if resource in self.kubelet.plugins
                    else "did not register"
                )
                raise DriverError(
                    ErrorCode.UNAVAILABLE,
                    f"{resource}: the legacy plugin {why} within {self._list_wait_s:g} s",
                ) from None
        return self._listing(resource)

    def _listing(self, resource: str) -> list[types.Device]:
        reachable = self._reachable.get(resource, False)
        return [device_from_record(d, reachable) for d in self._devices.get(resource, ())]

    def _plugin(self, resource: str) -> LegacyPlugin:
        plugin = self.kubelet.plugins.get(resource)
        if plugin is None or not plugin.connected or not self._reachable.get(resource):
            raise DriverError(ErrorCode.UNAVAILABLE, f"{resource}: the legacy plugin is not connected")
        return plugin

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        grants = await self._forward(
            resource, self._plugin(resource).client.allocate(containers, RPC_TIMEOUT_S)
        )
        return [grant_from_record(g) for g in grants]

    async def preferred_allocation(self, resource: str, request: types.PreferenceRequest) -> list[str]:
        asked = PreferredRequest(tuple(request.available), tuple(request.must_include), request.size)
        answers = await self._forward(
            resource, self._plugin(resource).client.preferred_allocation([asked], RPC_TIMEOUT_S)
        )
        return list(answers[0]) if answers else []

    async def prestart(self, resource: str, device_ids: list[str]) -> None:
        await self._forward(resource, self._plugin(resource).client.prestart(device_ids, PRESTART_TIMEOUT_S))

    @staticmethod
    async def _forward(resource: str, call: Awaitable[T]) -> T:
        """The legacy plugin's gRPC failure as the protocol's error (an unknown ID stays one)."""
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            message = f"{resource}: the legacy plugin answered {code.name}: {exc.details()}"
            if code is grpc.StatusCode.INVALID_ARGUMENT:
                raise DriverError(ErrorCode.INVALID_PARAMS, message) from None
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise DriverError(ErrorCode.UNAVAILABLE, message) from None
            raise DriverError(ErrorCode.INTERNAL_ERROR, message) from None

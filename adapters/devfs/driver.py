"""The devfs driver: device nodes matched by glob, listed with declared grants, watched for hot-plug.

Every device declares its grant, so devshim answers Allocate itself. The driver
still learns which devices are in use, from ``initialize`` (what devshim knows
to be allocated), ``prestart`` (declared, so the kubelet calls it for every
container) and ``allocate`` (should devshim ever ask), and forgets them on
``deallocate``. That is what decides a vanished node's fate: one in use stays
listed Unhealthy, so the kubelet keeps the pod's accounting and sees the failure,
until it is deallocated or ``vanished_grace_s`` passes; one not in use is dropped
at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from shim.sdk import DEVSHIM_VERSION, Driver, UnknownDevice, types
from shim.sdk.config import MAX_ATTRIBUTE_VALUE_LENGTH

from .config import DevfsConfig, GroupConfig
from .scan import Node, scan, watched_directories
from .watch import watch


def dra_attributes(node: Node) -> dict[str, types.Attribute]:
    """What DRA publishes of a node (docs/dra.md): its file name and, where sysfs says, NUMA node."""
    attributes = {"node": types.Attribute(string=node.name[:MAX_ATTRIBUTE_VALUE_LENGTH])}
    if node.numa_node is not None:
        attributes["numaNode"] = types.Attribute(int=node.numa_node)
    return attributes


def device_ids(node: Node, count: int) -> list[str]:
    """A node shared by ``count`` containers is ``count`` devices: <name>-0 .. <name>-<count-1>."""
    return [node.name] if count == 1 else [f"{node.name}-{i}" for i in range(count)]


def declared_grant(group: GroupConfig, device_id: str, node: Node) -> types.Grant:
    container_path = (group.container_path or node.path).replace("{name}", node.name)
    return types.Grant(
        device_nodes=[
            types.DeviceNode(
                container_path=container_path, host_path=node.path, permissions=group.permissions
            )
        ],
        mounts=[
            types.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in group.mounts
        ],
        cdi_devices=[c.replace("{id}", device_id).replace("{name}", node.name) for c in group.cdi_devices],
    )


def _merged(grants: list[types.Grant]) -> types.Grant:
    # The same merge devshim applies to declared grants: concatenated in order, repeats dropped.
    nodes: dict[tuple[str, str, str], None] = {}
    mounts: dict[tuple[str, str, bool], None] = {}
    cdi: dict[str, None] = {}
    for grant in grants:
        nodes.update(
            dict.fromkeys((n.container_path, n.host_path, n.permissions) for n in grant.device_nodes)
        )
        mounts.update(dict.fromkeys((m.container_path, m.host_path, m.read_only) for m in grant.mounts))
        cdi.update(dict.fromkeys(grant.cdi_devices))
    return types.Grant(
        device_nodes=[types.DeviceNode(container_path=c, host_path=h, permissions=p) for c, h, p in nodes],
        mounts=[types.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in mounts],
        cdi_devices=list(cdi),
    )


class DevfsDriver(Driver):
    name = "devshim-devfs"
    version = DEVSHIM_VERSION

    def __init__(self, config: DevfsConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._groups = {g.resource: g for g in config.groups}
        self._present: dict[str, dict[str, Node]] = {r: {} for r in self._groups}
        # Device ID -> (its node, when it stops being listed even if still allocated).
        self._vanished: dict[str, dict[str, tuple[Node, float]]] = {r: {} for r in self._groups}
        self._allocated: dict[str, set[str]] = {r: set() for r in self._groups}
        self._sent: dict[str, list[dict[str, Any]]] = {r: [] for r in self._groups}
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._expiry: asyncio.TimerHandle | None = None

    # --- the protocol ---------------------------------------------------------

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=r, prestart=True, deallocate=True) for r in self._groups]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return self._devices(resource)

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        group, present = self._groups[resource], self._present[resource]
        for device_id in (i for ids in containers for i in ids):
            if device_id not in present:
                raise UnknownDevice(resource, device_id)
        self._allocated[resource].update(i for ids in containers for i in ids)
        return [_merged([declared_grant(group, i, present[i]) for i in ids]) for ids in containers]

    async def prestart(self, resource: str, device_ids: list[str]) -> None:
        self._allocated[resource].update(device_ids)

    async def deallocate(self, resource: str, device_ids: list[str]) -> None:
        self._allocated[resource].difference_update(device_ids)
        if any(i in self._vanished[resource] for i in device_ids):
            self._poke()  # the next scan drops the vanished ones now free

    async def on_initialize(self, params: types.InitializeParams) -> None:
        for allocation in params.allocations:
            if allocation.resource in self._allocated:
                self._allocated[allocation.resource].update(allocation.device_ids)
        self._wake = asyncio.Event()
        self._rescan()
        if not self._tasks:
            patterns = [p for g in self._config.groups for p in g.paths]
            directories, deep = watched_directories(patterns)
            c = self._config
            self._tasks = [
                asyncio.create_task(watch(directories, deep, c.watch_mode, c.poll_interval_s, self._poke)),
                asyncio.create_task(self._follow()),
            ]

    async def on_shutdown(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # asyncio.wait, not `await task`: a cancellation of this shutdown must still propagate.
            await asyncio.wait(self._tasks)

    # --- scanning ---------------------------------------------------------------

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _follow(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            for resource in self._rescan():
                await self.devices_changed(resource, self._devices(resource))

    def _devices(self, resource: str) -> list[types.Device]:
        group = self._groups[resource]
        listed = [(i, node, types.Health.HEALTHY) for i, node in self._present[resource].items()]
        listed += [(i, node, types.Health.UNHEALTHY) for i, (node, _) in self._vanished[resource].items()]
        return [
            types.Device(
                id=i,
                health=health,
                numa_nodes=[node.numa_node] if node.numa_node is not None else [],
                grant=declared_grant(group, i, node),
                attributes=dra_attributes(node),
            )
            for i, node, health in listed
        ]

    def _rescan(self) -> list[str]:
        """Scan every group; the resources whose device list changed since last sent."""
        now = self._clock()
        changed: list[str] = []
        for resource, group in self._groups.items():
            present = {i: n for n in scan(group, self._config.sysfs_root) for i in device_ids(n, group.count)}
            vanished, allocated = self._vanished[resource], self._allocated[resource]
            for device_id, node in self._present[resource].items():
                if device_id not in present and device_id in allocated and device_id not in vanished:
                    logger.warning("{}: {} vanished while in use; listed Unhealthy", resource, node.path)
                    vanished[device_id] = (node, now + self._config.vanished_grace_s)
            for device_id, (_, deadline) in list(vanished.items()):
                if device_id in present or device_id not in allocated or deadline <= now:
                    del vanished[device_id]
            self._present[resource] = present
            listed = [d.to_dict() for d in self._devices(resource)]
            if listed != self._sent[resource]:
                self._sent[resource] = listed
                changed.append(resource)
        self._schedule_expiry(now)
        return changed

    def _schedule_expiry(self, now: float) -> None:
        # Without a deallocate, only the clock ends a vanished device's grace: wake for it.
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        deadlines = [deadline for v in self._vanished.values() for _, deadline in v.values()]
        if deadlines and self._wake is not None:
            delay = max(0.0, min(deadlines) - now)
            self._expiry = asyncio.get_running_loop().call_later(delay, self._poke)

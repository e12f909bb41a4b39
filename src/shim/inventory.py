"""devshim's persisted inventory: the last device list and the allocations in use, per resource.

A devshim restarted while a driver is down must still list that driver's devices (as Unhealthy):
the kubelet removes from the node any device missing from a list. A restarted driver is told which
allocations are in use. Both need what devshim knew before the restart, kept here as one JSON file
per resource in a state directory of devshim's own (never the device-plugins directory, whose
regular files older kubelets delete on start).

Nothing here raises on I/O or bad data: a lost inventory costs a short Unhealthy gap, while an
exception would stop devshim serving every resource. Invalid resource names are a caller's bug and
are refused with ValueError.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import re
import threading
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from loguru import logger

from shim.driverprotocol import (
    attributes_from_json,
    binding_from_json,
    capacity_from_json,
    capacity_policies_from_json,
    counter_sets_from_json,
    policy_json,
    taints_from_json,
)
from shim.files import UnreadableFile, read_bounded, write_atomically
from shim.incremental import EncodedList
from shim.model import Capabilities, Device, Health
from shim.slices import joined

VERSION = 1
SLICES = "inventory saves"  # the kind of long work saving is (shim/slices.py)
# A saved list of 100,000 devices (the most a static resource may have) is about 20 MiB; a file
# bigger than this is not one devshim wrote.
INVENTORY_FILE_LIMIT = 64 * 1024 * 1024

_T = TypeVar("_T")

# Both parts start and end alphanumerically, so a file name is never hidden (temp files are) and
# never "." or "..". The domain (a DNS subdomain for the kubelet) has no "_", which makes the
# first "_" of a file name the "/" of the resource: the mapping is reversible and collision-free.
_DOMAIN = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_RESOURCE = re.compile(rf"({_DOMAIN})/({_NAME})")
_FILE = re.compile(rf"({_DOMAIN})_({_NAME})\.json")


@dataclass(frozen=True)
class SavedResource:
    devices: tuple[Device, ...]
    """The last known device list: ids, health and NUMA nodes."""
    in_use: tuple[tuple[str, ...], ...]
    """Device-id groups allocated together (one per container), in allocation order."""
    capabilities: Capabilities = Capabilities()
    """What the driver last declared for the resource: a restored resource registers with the
    options it will most likely have again, not with none (which costs a second registration
    once the driver declares them)."""


class _Invalid(ValueError):
    """A saved file that parses as JSON but is not an inventory we wrote."""


def _file_name(resource: str) -> str:
    if not _RESOURCE.fullmatch(resource):
        raise ValueError(
            f"invalid resource name {resource!r}: expected domain/name, the domain of [A-Za-z0-9.-] and"
            " the name of [A-Za-z0-9._-], each starting and ending with a letter or digit"
        )
    return resource.replace("/", "_", 1) + ".json"


def _device_json(device: Device) -> str:
    saved: dict[str, object] = {"id": device.id, "health": device.health.value}
    saved["numa_nodes"] = device.numa_nodes
    # What DRA publishes, kept so a restarted devshim whose driver is down publishes it unchanged.
    if device.attributes:
        saved["attributes"] = {name: {a.kind.value: a.value} for name, a in device.attributes}
    if device.capacity:
        saved["capacity"] = dict(device.capacity)
    # Protocol 1.3 and 1.4's fields too: a restarted devshim must not publish a tainted device
    # untainted, a partition that consumes nothing, or a device that needs attaching without it.
    if device.taints:
        saved["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in device.taints]
    if device.counter_sets:
        saved["counter_sets"] = [{"name": c.name, "counters": dict(c.counters)} for c in device.counter_sets]
    if device.consumes_counters:
        saved["consumes_counters"] = [
            {"counter_set": c.name, "counters": dict(c.counters)} for c in device.consumes_counters
        ]
    if device.allow_multiple_allocations:
        saved["allow_multiple_allocations"] = True
    if device.capacity_policies:
        saved["capacity_policies"] = {name: policy_json(p) for name, p in device.capacity_policies}
    if device.binding is not None:
        saved["binding"] = {
            "conditions": list(device.binding.conditions),
            "failure_conditions": list(device.binding.failure_conditions),
            "binds_to_node": device.binding.binds_to_node,
        }
    return json.dumps(saved)


def _head(resource: str, saved: SavedResource) -> str:
    """The file's members but ``devices``, as a JSON object missing its closing brace."""
    head = json.dumps(
        {
            "version": VERSION,
            "resource": resource,
            "in_use": saved.in_use,
            "capabilities": [
                f.name for f in fields(saved.capabilities) if getattr(saved.capabilities, f.name)
            ],
            "saved_at": datetime.now(UTC).isoformat(),
        }
    )
    return head[:-1]


def _text(head: str, devices: str) -> str:
    """The file: ``head`` and the devices, each encoded, joined by ", "."""
    return head + ', "devices": [' + devices + "]}"


def _field(obj: dict[str, object], key: str, kind: type[_T], where: str) -> _T:
    if key not in obj:
        raise _Invalid(f"{where}{key!r} missing")
    value = obj[key]
    # bool is an int subclass; a JSON true is never a valid number here.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Invalid(f"{where}{key!r} is {type(value).__name__}, expected {kind.__name__}")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise _Invalid(f"{where} is not a list of non-empty strings")
    return tuple(value)


def _device(raw: object, index: int) -> Device:
    where = f"devices[{index}]: "
    if not isinstance(raw, dict):
        raise _Invalid(f"{where}not an object")
    device_id = _field(raw, "id", str, where)
    health = _field(raw, "health", str, where)
    numa = _field(raw, "numa_nodes", list, where)
    if not device_id:
        raise _Invalid(f"{where}empty id")
    if health not in (Health.HEALTHY, Health.UNHEALTHY):
        raise _Invalid(f"{where}health {health!r} is neither Healthy nor Unhealthy")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numa):
        raise _Invalid(f"{where}numa_nodes is not a list of non-negative integers")
    try:
        attributes = attributes_from_json(raw.get("attributes"))
        capacity = capacity_from_json(raw.get("capacity"))
        shared = raw.get("allow_multiple_allocations", False) is True
        return Device(
            device_id, Health(health), tuple(numa), attributes, capacity,
            taints_from_json(raw.get("taints")),
            counter_sets_from_json(raw.get("counter_sets")),
            counter_sets_from_json(raw.get("consumes_counters"), "consumes_counters"),
            shared,
            capacity_policies_from_json(raw.get("capacity_policies"), capacity, shared),
            binding_from_json(raw.get("binding")),
        )  # fmt: skip
    except ValueError as exc:
        raise _Invalid(f"{where}{exc}") from None


def _decode(text: str, resource: str) -> SavedResource:
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise _Invalid("not a JSON object")
    version = _field(raw, "version", int, "")
    if version != VERSION:
        raise _Invalid(f"unknown version {version} (this devshim reads {VERSION})")
    if (saved_for := _field(raw, "resource", str, "")) != resource:
        raise _Invalid(f"saved for resource {saved_for!r}, not {resource!r}")
    saved_at = _field(raw, "saved_at", str, "")
    try:
        datetime.fromisoformat(saved_at)
    except ValueError:
        raise _Invalid(f"saved_at {saved_at!r} is not an ISO 8601 time") from None
    raw_devices = _field(raw, "devices", list, "")
    devices = tuple(_device(d, i) for i, d in enumerate(raw_devices))
    seen: set[str] = set()
    for device in devices:
        if device.id in seen:
            raise _Invalid(f"duplicate device id {device.id!r}")
        seen.add(device.id)
    raw_in_use = _field(raw, "in_use", list, "")
    in_use = tuple(_strings(group, f"in_use[{i}]") for i, group in enumerate(raw_in_use))
    # Optional (files written before it have none); a name this devshim does not know, written by
    # a newer one, is left out rather than the whole inventory refused.
    declared = _strings(raw.get("capabilities", []), "capabilities") if raw.get("capabilities") else ()
    known = {f.name for f in fields(Capabilities)}
    capabilities = Capabilities(**{name: True for name in declared if name in known})
    return SavedResource(devices, in_use, capabilities)


class InventoryStore:
    """One JSON file per resource in ``state_dir``, replaced atomically on every save."""

    def __init__(self, state_dir: Path) -> None:
        self._dir = state_dir
        self._devices: dict[str, EncodedList[Device, str]] = {}  # per resource, kept between saves
        # Saves run on threads and a closing source saves at once, so two writes of one resource can
        # overlap: they are made one at a time, and a snapshot older than the one on disk is dropped.
        self._writing = threading.Lock()
        self._stamps = itertools.count(1)
        self._written: dict[str, int] = {}

    @classmethod
    def of_driver(cls, state_dir: Path, driver: str) -> InventoryStore:
        """Driver ``driver``'s store: where its host saves and restores its resources, and DRA
        ownership reads what a resource not served yet last held."""
        return cls(state_dir / "drivers" / driver)

    def _path(self, resource: str) -> Path:
        return self._dir / _file_name(resource)

    def load(self, resource: str) -> SavedResource | None:
        """The saved inventory, or None when there is none or it cannot be trusted (logged)."""
        path = self._path(resource)
        try:
            raw = read_bounded(path, INVENTORY_FILE_LIMIT, follow_links=False)
        except UnreadableFile as exc:
            if exc.errno != errno.ENOENT:
                why = exc.strerror
                logger.warning("inventory: cannot read {}: {}; starting {} without it", path, why, resource)
            return None
        try:
            return _decode(raw.decode("utf-8"), resource)
        except (ValueError, RecursionError) as exc:  # not UTF-8, JSONDecodeError, _Invalid: ValueErrors
            logger.warning("inventory: ignoring {}: {}; starting {} without it", path, exc, resource)
            return None

    def stamp(self) -> int:
        """Taken with a snapshot, on the event loop: orders the snapshots as they were taken."""
        return next(self._stamps)

    def save(self, resource: str, saved: SavedResource, stamp: int | None = None) -> None:
        """Replace the saved inventory; on failure log an error and keep the previous file whole.
        A snapshot stamped before the one last written is not written (it is stale)."""
        stamp = self.stamp() if stamp is None else stamp
        devices = ", ".join(self._encoded(resource).encode(saved.devices))
        self._write(resource, _text(_head(resource, saved), devices), stamp)

    async def save_in_slices(self, resource: str, saved: SavedResource, stamp: int) -> None:
        """``save`` from the event loop: the devices are encoded there, a slice at a time (only
        those that changed since the last save), and the file is written on a thread. Encoding
        on the thread would hold the GIL against the loop, in 5 ms turns, for as long as it ran
        (half a second for a first list of 50,000 devices): every Allocate meanwhile waited."""
        devices = await joined(
            ", ", await self._encoded(resource).encode_in_slices(saved.devices, SLICES), SLICES
        )
        await asyncio.to_thread(self._write_text, resource, _head(resource, saved), devices, stamp)

    def _write_text(self, resource: str, head: str, devices: str, stamp: int) -> None:
        self._write(resource, _text(head, devices), stamp)  # a few MB copied: on the thread

    def _encoded(self, resource: str) -> EncodedList[Device, str]:
        return self._devices.setdefault(resource, EncodedList(_device_json))

    def _write(self, resource: str, text: str, stamp: int) -> None:
        with self._writing:
            if stamp < self._written.get(resource, 0):
                return
            self._written[resource] = stamp
            self._replace(resource, text)

    def _replace(self, resource: str, text: str) -> None:
        path = self._path(resource)
        try:
            if not self._dir.is_dir():
                self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                # mkdir's mode is filtered by the umask; the inventory names devices and pods'
                # allocations, which is nobody else's business.
                self._dir.chmod(0o700)
            write_atomically(path, text.encode(), mode=0o600)
        except OSError as exc:
            logger.error("inventory: cannot save {}: {}; a restart now loses its devices", path, exc)

    def forget(self, resource: str) -> None:
        """Remove the saved inventory, if any (a resource that is gone for good)."""
        path = self._path(resource)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            logger.error("inventory: cannot remove {}: {}", path, exc)

    def resources(self) -> list[str]:
        """Names of the resources with a saved inventory, sorted; temp and foreign files are skipped."""
        try:
            names = [entry.name for entry in self._dir.iterdir()]
        except FileNotFoundError:
            return []
        except OSError as exc:
            logger.error("inventory: cannot list {}: {}", self._dir, exc)
            return []
        return sorted(f"{m[1]}/{m[2]}" for name in names if (m := _FILE.fullmatch(name)))

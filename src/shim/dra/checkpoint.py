"""The claims one DRA driver has prepared on this node, kept in devshim's state dir.

A devshim restarted between NodePrepareResources and NodeUnprepareResources must answer a
repeated prepare as before (without asking the driver again) and still undo the preparation
at unprepare: the driver's deallocate, for the same device groups. A claim is recorded as
``preparing`` (with the groups the driver is asked for) before the driver is called and as
``prepared`` (with the answer) after, so a devshim killed in between deallocates on unprepare
what it may have allocated, and prepares again on a repeated prepare.

Each entry also keeps the boot it was made in and the CDI spec it wrote. The kubelet keeps
"prepared" in memory only, so after its own restart or the node's it prepares every claim of
its pods again (upstream's PrepareResourceClaims guarantees): within one boot the answer is the
checkpoint's, with its spec put back if the CDI folder lost it (a tmpfs, /var/run/cdi); after a
reboot the devices were reset, so the claim is prepared afresh, and nothing is deallocated for a
preparation the reboot already undid.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from loguru import logger

from shim.driverprotocol import share_json
from shim.files import UnreadableFile, read_bounded, write_atomically
from shim.model import DeviceShare

FORMAT = 1  # fields added since (admin_access, shares, boot_id, cdi_spec) are optional
MAX_BYTES = 64 * 1024 * 1024  # devshim's own file; bounded all the same
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # the kernel's, new at every boot
Sync = Literal["now", "soon", "boot"]  # when a change is on disk (Checkpoint.put)


def this_boot(source: Path = BOOT_ID) -> str | None:
    """The running kernel's boot ID; None where it cannot be read (every entry then counts as
    of this boot, as before boot IDs were kept)."""
    try:
        return read_bounded(source, 64).decode("ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a claim's answer to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None  # the allocation's shareID, for a share of a device


@dataclass(frozen=True, slots=True)
class Group:
    """Devices of one resource the driver was asked to allocate together."""

    resource: str
    device_ids: tuple[str, ...]
    admin_access: bool = False  # an admin-access claim's: taken from no one, given back to no one
    shares: tuple[DeviceShare, ...] = ()  # a share of a device that allows multiple allocations


@dataclass(frozen=True, slots=True)
class Entry:
    namespace: str
    name: str
    groups: tuple[Group, ...]
    devices: tuple[PreparedDevice, ...] | None  # None: preparing, the driver's answer not in
    boot_id: str | None = None  # the boot it was made in; None: unknown (an older file)
    cdi_spec: dict[str, Any] | None = None  # the claim's CDI spec as written; None: none written

    @property
    def prepared(self) -> bool:
        return self.devices is not None


class Checkpoint:
    """The file ``<state_dir>/dra/<driver>.json``, read at start and rewritten on each change."""

    def __init__(self, state_dir: Path, driver: str) -> None:
        self.path = state_dir / "dra" / f"{driver}.json"
        self.driver = driver
        self.boot_id = this_boot()
        self._claims: dict[str, Entry] = self._load()
        self._changes = 0  # changes made to _claims; how many of them the file holds; synced
        self._written = 0
        self._synced = 0
        self._saving = asyncio.Lock()
        self._syncing: set[asyncio.Task[None]] = set()  # "soon" syncs under way
        # Each entry's JSON, kept by the entry's identity: a save re-encodes only what changed
        # (a flood of 64 claims rewrote 64 entries a claim; bench/dra_flood.py's profile).
        self._encoded: dict[str, tuple[Entry, dict[str, Any]]] = {}

    def __iter__(self) -> Iterator[tuple[str, Entry]]:
        return iter(list(self._claims.items()))

    def get(self, uid: str) -> Entry | None:
        return self._claims.get(uid)

    def of_this_boot(self, entry: Entry) -> bool:
        """Whether ``entry`` was made since the node last booted (unknown counts as yes)."""
        return entry.boot_id is None or self.boot_id is None or entry.boot_id == self.boot_id

    async def put(self, uid: str, entry: Entry, *, sync: Sync = "now") -> None:
        """Once the file holds ``entry``; OSError if it cannot be written. ``sync`` says when it
        is on disk, past a power cut: "now", before this returns; "soon", in the background
        right after (``flush`` waits for it); "boot", whenever a later save syncs: for what
        only this boot reads back (preparer.py says which is which, and why)."""
        self._claims[uid] = entry
        await self._saved(synced=sync == "now")
        if sync == "soon":
            task = asyncio.create_task(self._save(self._changes, synced=True))
            self._syncing.add(task)
            task.add_done_callback(self._synced_behind)

    async def drop(self, uid: str) -> None:
        self._encoded.pop(uid, None)
        if self._claims.pop(uid, None) is not None:
            await self._saved(synced=True)

    async def flush(self) -> None:
        """Until every change made so far is on disk."""
        await self._save(self._changes, synced=True)

    def _synced_behind(self, task: asyncio.Task[None]) -> None:
        self._syncing.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error(
                "DRA driver {}: the checkpoint {} holds a claim prepared but could not be synced "
                "to disk ({}); the next change tries again",
                self.driver, self.path, exc,
            )  # fmt: skip

    async def _saved(self, *, synced: bool) -> None:
        self._changes += 1
        await self._save(self._changes, synced=synced)

    async def _save(self, wanted: int, *, synced: bool) -> None:
        """Until the file holds the first ``wanted`` changes (``synced``: on disk). A synced
        write (milliseconds) runs on a thread, so the loop serves other calls meanwhile; an
        unsynced one, a page-cache copy, on the loop. Saves run one at a time, each of the
        claims as they are when it starts, so the file never goes back to an older state, and
        changes made while one runs are all written by the next; an unsynced save never stands
        for a synced one."""
        async with self._saving:
            if (self._synced if synced else self._written) >= wanted:
                return  # a save that started after this change has written it
            taken = self._changes
            claims = {uid: self._json(uid, entry) for uid, entry in self._claims.items()}
            # orjson: the standard library's encoder is pure Python once indented, 1 ms a claim
            # on the loop at 64 claims prepared at once (a profile of bench/dra_flood.py).
            body = orjson.dumps(
                {"format": FORMAT, "driver": self.driver, "claims": claims}, option=orjson.OPT_INDENT_2
            )
            if synced:
                await asyncio.to_thread(self._write, body, True)
                self._synced = taken
            else:
                self._write(body, False)
            self._written = taken

    def _json(self, uid: str, entry: Entry) -> dict[str, Any]:
        kept = self._encoded.get(uid)
        if kept is None or kept[0] is not entry:
            kept = self._encoded[uid] = (entry, _to_json(entry))
        return kept[1]

    def _write(self, body: bytes, synced: bool) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(self.path, body, mode=0o600, synced=synced)

    def _load(self) -> dict[str, Entry]:
        try:
            # devshim writes this file itself, never as a link: a FIFO, a device or a link put in its
            # place is refused unread (a FIFO would block start-up, /dev/zero never end).
            raw = read_bounded(self.path, MAX_BYTES, follow_links=False)
        except UnreadableFile as exc:
            if exc.errno == errno.ENOENT:
                return {}
            return self._set_aside(exc.strerror or str(exc))
        try:
            body = json.loads(raw)
            if body.get("format") != FORMAT or body.get("driver") != self.driver:
                raise ValueError(f"format {body.get('format')!r} of driver {body.get('driver')!r}")
            return {uid: _from_json(entry) for uid, entry in body["claims"].items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            return self._set_aside(str(exc))
        except RecursionError:
            return self._set_aside("it is nested too deeply to parse")

    def _set_aside(self, why: str) -> dict[str, Entry]:
        """No claims, with the unreadable file kept for a person to read, never silently overwritten."""
        aside = self.path.with_suffix(".unreadable")
        try:
            os.replace(self.path, aside)
            kept = f"moved to {aside}"
        except OSError as exc:
            kept = f"could not be moved to {aside} ({exc.strerror}), the next change replaces it"
        logger.error(
            "DRA driver {}: the prepared-claims checkpoint {} is unreadable ({}); {}, "
            "starting with none: claims prepared before are not undone at unprepare",
            self.driver, self.path, why, kept,
        )  # fmt: skip
        return {}


def _to_json(entry: Entry) -> dict[str, Any]:
    return {
        "namespace": entry.namespace,
        "name": entry.name,
        "groups": [_group_json(g) for g in entry.groups],
        "devices": None
        if entry.devices is None
        else [
            {
                "request_names": list(d.request_names),
                "pool": d.pool,
                "device": d.device,
                "cdi_device_ids": list(d.cdi_device_ids),
                **({"share_id": d.share_id} if d.share_id is not None else {}),
            }
            for d in entry.devices
        ],
        **({"boot_id": entry.boot_id} if entry.boot_id is not None else {}),
        **({"cdi_spec": entry.cdi_spec} if entry.cdi_spec is not None else {}),
    }


def _group_json(group: Group) -> dict[str, Any]:
    written: dict[str, Any] = {"resource": group.resource, "device_ids": list(group.device_ids)}
    if group.admin_access:  # only then: a file an older devshim wrote reads the same
        written["admin_access"] = True
    if group.shares:  # likewise
        written["shares"] = [share_json(s) for s in group.shares]
    return written


def _share(raw: dict[str, Any]) -> DeviceShare:
    consumed = raw.get("consumed_capacity") or {}
    return DeviceShare(
        str(raw["device_id"]),
        str(raw["share_id"]),
        tuple(sorted((str(k), str(v)) for k, v in consumed.items())),
    )


def _from_json(raw: dict[str, Any]) -> Entry:
    devices = raw["devices"]
    boot_id, cdi_spec = raw.get("boot_id"), raw.get("cdi_spec")
    if not isinstance(boot_id, str | None) or not isinstance(cdi_spec, dict | None):
        raise TypeError("a claim's boot_id or cdi_spec is of the wrong type")
    return Entry(
        namespace=str(raw["namespace"]),
        name=str(raw["name"]),
        groups=tuple(
            Group(
                str(g["resource"]),
                tuple(map(str, g["device_ids"])),
                g.get("admin_access") is True,
                tuple(_share(s) for s in g.get("shares") or ()),
            )
            for g in raw["groups"]
        ),
        devices=None
        if devices is None
        else tuple(
            PreparedDevice(
                tuple(map(str, d["request_names"])),
                str(d["pool"]),
                str(d["device"]),
                tuple(map(str, d["cdi_device_ids"])),
                str(d["share_id"]) if d.get("share_id") is not None else None,
            )
            for d in devices
        ),
        boot_id=boot_id,
        cdi_spec=cdi_spec,
    )

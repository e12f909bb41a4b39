"""The allocations whose devices devshim's binder asked a driver to attach (shim/dra/binding.py),
kept in devshim's state folder until each is detached: a claim freed or deleted while devshim was
down is still detached at its next start, and hardware attached for a pod that never bound is not
left attached to the node.

An allocation is kept before its attach is asked (a devshim killed mid-attach detaches it once
more: a driver's detach of a device not attached does nothing), and forgotten once its detach is
answered. A file that cannot be read is said in the log and taken as empty: what it held is then
left to the driver's own bookkeeping (its initialize lists nothing attached).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from loguru import logger

from shim.files import UnreadableFile, read_bounded, write_atomically

FILE_LIMIT = 4 * 1024 * 1024  # some 20,000 allocations: far more than a node's devices


@dataclass(frozen=True, slots=True)
class Attachment:
    """One allocation of one device: the claim, its uid and allocation time, the DRA device (and
    share), and the resource and device ID its driver knows it by."""

    claim: str  # namespace/name
    uid: str
    allocated: str  # the allocation's allocationTimestamp
    device: str
    share: str
    resource: str
    device_id: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.uid, self.allocated, self.device, self.share)


class AttachedStore:
    def __init__(self, state_dir: Path | None, driver: str) -> None:
        """``state_dir`` None: kept in memory only (tests)."""
        self.path = state_dir / "dra" / f"{driver}-attached.json" if state_dir is not None else None

    def load(self) -> list[Attachment]:
        if self.path is None or not self.path.exists():
            return []
        try:
            raw = json.loads(read_bounded(self.path, FILE_LIMIT, follow_links=False))
            return [Attachment(**entry) for entry in raw["attached"]]
        except (UnreadableFile, ValueError, TypeError, KeyError) as exc:
            logger.error(
                "{}: not devshim's list of attached devices ({}); starting with none", self.path, exc
            )
            return []

    def save(self, attachments: list[Attachment]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        body = {"version": 1, "attached": [asdict(a) for a in attachments]}
        write_atomically(self.path, json.dumps(body).encode(), mode=0o600)

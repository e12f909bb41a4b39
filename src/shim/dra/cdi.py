"""A prepared claim's grants as a CDI spec: what the container runtime injects (docs/dra.md, "CDI").

The kubelet never reads these files: it hands the container runtime the CDI device IDs that
NodePrepareResources answered, and the runtime (containerd, CRI-O) resolves them through the
specs in its CDI directories. One spec file per claim, holding one CDI device per grant, named
``<driver>/claim=<claim uid>-<n>``, written whole (a rename) so a runtime never reads half of one.

The ``cdiVersion`` written is the lowest the content needs (the rules of the CDI spec's
specs-go version.go, tags.cncf.io/container-device-interface): 0.3.0, or 0.5.0 where a device
node's container path is not its host path or a device name starts with a digit. The kind's
vendor is the DRA driver's name, which settings hold to CDI's vendor rule (a letter first). A grant's
annotations have no place in CDI's container edits (nor in DRA's answer): they are not carried.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shim.files import write_atomically
from shim.model import ContainerGrant

CLASS = "claim"
SPEC_PREFIX = "devshim-"
EARLIEST = "0.3.0"
HOST_PATH_VERSION = "0.5.0"  # a device node's hostPath; a device name starting with a digit


@dataclass(frozen=True)
class CdiDevice:
    """One CDI device of a claim: the grant one driver call gave for some of its devices."""

    name: str
    grant: ContainerGrant

    def qualified(self, driver: str) -> str:
        return f"{driver}/{CLASS}={self.name}"


def device_name(claim_uid: str, index: int) -> str:
    return f"{claim_uid}-{index}"


def has_edits(grant: ContainerGrant) -> bool:
    """CDI refuses a device with no container edits; a grant of only CDI names has none."""
    return bool(grant.envs or grant.mounts or grant.device_nodes)


def spec(driver: str, devices: Sequence[CdiDevice]) -> dict[str, Any]:
    """The CDI spec of ``devices`` (each with edits), at the lowest version its content needs."""
    body = [{"name": d.name, "containerEdits": _edits(d.grant)} for d in devices]
    needs_host_path = any(
        n.host_path != n.container_path for d in devices for n in d.grant.device_nodes
    ) or any(d.name[:1].isascii() and d.name[:1].isdigit() for d in devices)
    return {
        "cdiVersion": HOST_PATH_VERSION if needs_host_path else EARLIEST,
        "kind": f"{driver}/{CLASS}",
        "devices": body,
    }


def _edits(grant: ContainerGrant) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    if grant.envs:
        edits["env"] = [f"{k}={v}" for k, v in sorted(grant.envs.items())]
    if grant.device_nodes:
        edits["deviceNodes"] = [
            {"path": n.container_path, "permissions": n.permissions}
            | ({"hostPath": n.host_path} if n.host_path != n.container_path else {})
            for n in grant.device_nodes
        ]
    if grant.mounts:
        # The options containerd gives a device plugin's mounts (a recursive private bind).
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["rbind", "rprivate", "ro" if m.read_only else "rw"],
            }
            for m in grant.mounts
        ]
    return edits


class SpecDir:
    """The CDI spec directory devshim writes to (``dra.cdi_dir``): one file per prepared claim."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, driver: str, claim_uid: str) -> Path:
        return self.folder / f"{SPEC_PREFIX}{driver}-{claim_uid}.json"

    def write(self, driver: str, claim_uid: str, devices: Sequence[CdiDevice]) -> Path:
        """The claim's spec, replacing any before it; OSError if it cannot be written whole."""
        path = self.path(driver, claim_uid)
        self.folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        write_atomically(path, json.dumps(spec(driver, devices), indent=1).encode(), mode=0o644)
        return path

    def remove(self, driver: str, claim_uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(driver, claim_uid).unlink()

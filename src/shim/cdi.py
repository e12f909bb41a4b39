"""CDI specs as the container runtime reads them, and the specs drivers ship (docs/driver-protocol.md, "CDI").

The runtime (containerd, CRI-O) resolves a CDI device name ``vendor/class=name`` through the spec
files in its CDI directories (/etc/cdi, /var/run/cdi); the kubelet never reads them. devshim
writes two kinds there: each prepared DRA claim's spec (``SpecDir``: one file per claim, one CDI
device per grant, named ``<DRA driver>/claim=<claim uid>-<n>``; the kind's vendor is the DRA
driver's name, which settings hold to CDI's vendor rule; docs/dra.md, "CDI"), and the specs
drivers ship in ``initialize`` (``ShippedSpecs``, protocol 1.2), so the names a driver grants
resolve on the node without the driver writing into the host's folders. Every file is written
whole (a rename), so a runtime never reads half of one.

Both are rendered here, from grants: a driver states devices and their edits (envs, mounts,
device nodes), never a spec's raw JSON, so what a spec can make the runtime do (hooks run on
the host, additional GIDs, RDT) stays out of a driver's reach.

The ``cdiVersion`` written is the lowest the content needs (the rules of the CDI spec's
specs-go version.go, tags.cncf.io/container-device-interface): 0.3.0, or 0.5.0 where a device
node's container path is not its host path or a device name starts with a digit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from shim.files import write_atomically
from shim.model import CdiSpec, CdiSpecDevice, ContainerGrant

EARLIEST = "0.3.0"
HOST_PATH_VERSION = "0.5.0"  # a device node's hostPath; a device name starting with a digit
SPEC_PREFIX = "devshim-"  # a claim's: devshim-<DRA driver>-<claim uid>.json
SHIPPED_PREFIX = "devshim-driver-"  # a driver's: devshim-driver-<driver>@<vendor>+<class>.json
CLASS = "claim"  # the class of a claim's CDI devices


def has_edits(grant: ContainerGrant) -> bool:
    """CDI refuses a device with no container edits; a grant of only CDI names has none."""
    return bool(grant.envs or grant.mounts or grant.device_nodes)


def spec_json(spec: CdiSpec) -> dict[str, Any]:
    """The spec as the runtime reads it, at the lowest version its content needs."""
    devices = spec.devices
    needs_host_path = any(
        n.host_path != n.container_path for d in devices for n in d.edits.device_nodes
    ) or any(d.name[:1].isascii() and d.name[:1].isdigit() for d in devices)
    return {
        "cdiVersion": HOST_PATH_VERSION if needs_host_path else EARLIEST,
        "kind": spec.kind,
        "devices": [{"name": d.name, "containerEdits": _edits(d.edits)} for d in devices],
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


def write_spec(path: Path, spec: CdiSpec) -> None:
    """``spec`` at ``path``, whole (a rename), readable by the runtime; OSError if it cannot be."""
    _write_json(path, spec_json(spec), synced=True)


def _write_json(path: Path, body: dict[str, Any], *, synced: bool) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    # orjson (C): the standard library's indented encoder is pure Python, and holds the GIL
    # against the event loop even on a thread.
    write_atomically(path, orjson.dumps(body, option=orjson.OPT_INDENT_2), mode=0o644, synced=synced)


class ShippedSpecs:
    """The specs one driver ships, in the node's CDI folder: one file a kind,
    ``devshim-driver-<driver>@<vendor>+<class>.json`` (neither a driver's name nor a kind holds
    "@" or "+", so no two drivers' or kinds' files share a name). Each ``initialize`` replaces
    the set, and a kind no longer shipped is removed. Nothing is removed when the driver or devshim stops: a
    successor (a restarted devshim, one taking over in a handover) ships the same files, and
    containers created meanwhile still resolve their names."""

    def __init__(self, folder: Path, driver: str) -> None:
        self.folder, self.driver = folder, driver

    def path(self, kind: str) -> Path:
        return self.folder / f"{SHIPPED_PREFIX}{self.driver}@{kind.replace('/', '+')}.json"

    def replace(self, specs: Sequence[CdiSpec]) -> list[Path]:
        """Write ``specs`` and remove this driver's files of any other kind; the paths written."""
        written = []
        for spec in specs:
            write_spec(path := self.path(spec.kind), spec)
            written.append(path)
        for stale in self.folder.glob(f"{SHIPPED_PREFIX}{self.driver}@*.json"):
            if stale not in written:
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
        return written


# --- DRA claims ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CdiDevice:
    """One CDI device of a claim: the grant one driver call gave for some of its devices."""

    name: str
    grant: ContainerGrant

    def qualified(self, driver: str) -> str:
        return f"{driver}/{CLASS}={self.name}"


def device_name(claim_uid: str, index: int) -> str:
    return f"{claim_uid}-{index}"


def claim_spec(driver: str, devices: Sequence[CdiDevice]) -> CdiSpec:
    """The CDI spec of a claim's ``devices`` (each with edits)."""
    return CdiSpec(f"{driver}/{CLASS}", tuple(CdiSpecDevice(d.name, d.grant) for d in devices))


def spec(driver: str, devices: Sequence[CdiDevice]) -> dict[str, Any]:
    """The claim's spec as the runtime reads it."""
    return spec_json(claim_spec(driver, devices))


class SpecDir:
    """The CDI folder DRA claims' specs go to (``dra.cdi_dir``): one file per prepared claim. A
    grant's annotations have no place in CDI's container edits (nor in DRA's answer): they are
    not carried; a grant with no edits (only CDI names of its own) writes no spec."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, driver: str, claim_uid: str) -> Path:
        return self.folder / f"{SPEC_PREFIX}{driver}-{claim_uid}.json"

    def write(self, driver: str, claim_uid: str, body: dict[str, Any]) -> Path:
        """The claim's spec (``spec``'s JSON, or the checkpoint's copy of it), replacing any before
        it; OSError if it cannot be written whole. Whole but unsynced: it is read in this boot
        only (after a reboot the claim is prepared again, its spec written anew; dra/preparer.py),
        and the CDI folder is usually a tmpfs, where a sync does nothing."""
        path = self.path(driver, claim_uid)
        _write_json(path, body, synced=False)
        return path

    def has(self, driver: str, claim_uid: str) -> bool:
        return self.path(driver, claim_uid).is_file()

    def remove(self, driver: str, claim_uid: str) -> None:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # no such file there
            self.path(driver, claim_uid).unlink()

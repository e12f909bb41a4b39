"""Whether the CDI names a driver grants resolve on the node, read as a container runtime reads them.

containerd and CRI-O resolve a CDI device ``vendor/class=name`` through the spec files of their
CDI folders (/etc/cdi, /var/run/cdi): a spec (JSON or YAML) whose ``kind`` is ``vendor/class``
and which lists a device ``name`` (tags.cncf.io/container-device-interface, pkg/cdi cache.go).
A name nothing resolves fails the container at its creation, long after Allocate answered, so
`devshim compat` checks every name it sees granted: in the specs devshim wrote for the driver
(those it ships, protocol 1.2) and in the folders ``--cdi-dir`` names (specs the vendor installs
on the node). This is compat's own reading of the files, not devshim's writer: a judge.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from shim.files import read_bounded

SUFFIXES = (".json", ".yaml", ".yml")
MAX_SPEC_BYTES = 4 * 1024 * 1024  # a spec of thousands of devices is well under this


def devices_by_kind(folders: Iterable[Path]) -> dict[str, set[str]]:
    """Each kind the spec files in ``folders`` define, and its device names; files that are not
    specs (unreadable, too large, not a mapping with a kind) are passed over, as a runtime's
    cache passes over a spec it cannot load."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            try:
                spec = yaml.safe_load(read_bounded(path, MAX_SPEC_BYTES))
            except (OSError, ValueError, yaml.YAMLError):
                continue
            if isinstance(spec, dict) and isinstance(kind := spec.get("kind"), str):
                listed = spec.get("devices")
                devices = listed if isinstance(listed, list) else []
                found.setdefault(kind, set()).update(
                    d["name"] for d in devices if isinstance(d, dict) and isinstance(d.get("name"), str)
                )
    return found


def unresolved(names: Sequence[str], folders: Sequence[Path]) -> list[str]:
    """The names of ``names`` no spec in ``folders`` resolves."""
    found = devices_by_kind(folders)
    left = []
    for name in names:
        kind, _, device = name.partition("=")
        if device not in found.get(kind, ()):
            left.append(name)
    return left


def advice(name: str, folders: Sequence[Path]) -> str:
    """One line: why ``name`` does not resolve, and what to do."""
    searched = ", ".join(map(str, folders)) or "no folder"
    return (
        f"the CDI device {name} resolves in no CDI spec ({searched}); a container given it fails to "
        'start: ship its spec in initialize (cdi_specs, docs/driver-protocol.md "CDI"), name the '
        "folder the vendor installs it in with --cdi-dir, or grant plain edits instead"
    )

"""DRA device names, from driver IDs (the checks on driver and node names are in shim/names.py).

A device plugin's device ID is any string without spaces or commas (GPU-5d2c..., sim_0); a DRA
device name is a DNS label: at most 63 characters of [a-z0-9-], starting and ending with a
letter or digit. The mapping (docs/dra.md, "Device names") is a pure function of the ID, so the
same ID always gets the same name, on every node and after every restart:

1. an ID that already is a DNS label is its own name;
2. otherwise it is lowercased, every run of other characters becomes one "-", dashes at either
   end are dropped, and "-" and the first 8 hex digits of the ID's SHA-256 are appended (cutting
   the rest to fit 63), so two IDs that differ only in case or punctuation stay apart.

Two IDs of one pool that still meet in one name (in one resource, or in two resources of the
pool) are a clash: one keeps the name and the other is refused (shim/dra/ownership.py says which).
"""

from __future__ import annotations

import hashlib
import re

from shim.facts import DNS_LABEL_MAX, is_dns_label

_OTHER = re.compile(r"[^a-z0-9]+")
_HASH_DIGITS = 8


def device_name(device_id: str) -> str:
    """The DRA device name of a driver's device ID (the rules above)."""
    if is_dns_label(device_id):
        return device_id
    suffix = hashlib.sha256(device_id.encode()).hexdigest()[:_HASH_DIGITS]
    stem = _OTHER.sub("-", device_id.lower()).strip("-")[: DNS_LABEL_MAX - _HASH_DIGITS - 1].rstrip("-")
    return f"{stem}-{suffix}" if stem else f"device-{suffix}"


def collisions(device_ids: list[str]) -> dict[str, list[str]]:
    """The names that more than one of ``device_ids`` maps to, with those IDs."""
    by_name: dict[str, list[str]] = {}
    for device_id in device_ids:
        by_name.setdefault(device_name(device_id), []).append(device_id)
    return {name: ids for name, ids in by_name.items() if len(ids) > 1}

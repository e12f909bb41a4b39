"""What a policy is written as: the allowlists an operator declares for a driver or resource.

Everything is denied unless declared here (docs/configuration.md, "Grant policy"); the floor
(floor.py) stays in force under any declaration unless one rule is lifted with ``unsafe``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from shim.configfile import StrictModel
from shim.facts import CDI_VENDOR_OR_CLASS, cdi_device_name_problem, cdi_kind_problem

from .floor import FloorRule

# POSIX's portable env names: anything else is no variable a program reads by name.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Annotations containerd and CRI-O read as CDI device names (comma-separated).
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
# An env name allowed: exact ("SIM_DEVICES"), a prefix ending in '*' ("NVIDIA_*"), or '*'.
_ENV_ENTRY = re.compile(r"\*|[A-Za-z_][A-Za-z0-9_]*\*?")


def _env_entry(value: str) -> str:
    if not _ENV_ENTRY.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an env name, or a name prefix ending in '*' (such as NVIDIA_*): "
            "a grant's variables are declared by name"
        )
    return value


def _path_glob(value: str) -> str:
    """A host path glob: absolute, normalised, without NUL; '*' and '?' within a component,
    '**' across them."""
    if "\x00" in value:
        raise ValueError("a path must not contain a NUL byte")
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path")
    parts = value.split("/")
    if ".." in parts or "." in parts or "//" in value or (value != "/" and value.endswith("/")):
        raise ValueError(f"{value!r} is not a normalised path (no '.', '..', '//' or trailing '/')")
    return value


def cdi_kind(name: str) -> str | None:
    """The kind "vendor/class" of a CDI device name "vendor/class=device"; None if it is none."""
    kind, equals, device = name.partition("=")
    if equals and cdi_kind_problem(kind) is None and cdi_device_name_problem(device) is None:
        return kind
    return None


def _cdi_kind(value: str) -> str:
    """A CDI kind "vendor/class", "vendor/*" for any class of one vendor, or "*"."""
    if value == "*":
        return value
    vendor, slash, device_class = value.partition("/")
    if not (
        slash
        and CDI_VENDOR_OR_CLASS.fullmatch(vendor)
        and (device_class == "*" or CDI_VENDOR_OR_CLASS.fullmatch(device_class))
    ):
        raise ValueError(f"{value!r} is not a CDI kind 'vendor/class' (or 'vendor/*')")
    return value


EnvEntry = Annotated[str, AfterValidator(_env_entry)]
PathGlob = Annotated[str, AfterValidator(_path_glob)]
CdiKind = Annotated[str, AfterValidator(_cdi_kind)]


class GrantPolicySettings(StrictModel):
    """What a resource's grants may hold; anything else fails Allocate (docs/configuration.md,
    "Grant policy"). Empty by default: a driver grants nothing its operator did not declare."""

    # Env names the grants may set (exact, or a prefix ending in '*').
    envs: list[EnvEntry] = []
    # Device nodes: host path globs, e.g. /dev/nvidia* or /dev/dri/renderD*. Where the path leads
    # (links followed) must match too, and be of device_node_types.
    device_nodes: list[PathGlob] = []
    # A block device is a disk (the host's root among them); null: anything, even nothing.
    device_node_types: list[Literal["char", "block"]] | None = ["char"]
    # Mounts: host path globs (/opt/vendor/** for a tree).
    mounts: list[PathGlob] = []
    read_only_mounts: bool = True
    # CDI device kinds the grants may name (cdi_devices, and cdi.k8s.io/ annotations).
    cdi_kinds: list[CdiKind] = []
    # Annotation keys must start with one of these (plain string prefixes).
    annotation_key_prefixes: list[Annotated[str, Field(min_length=1)]] = []
    # A host path below a world-writable directory (/dev/shm, /tmp) can be replaced by anyone
    # between devshim's check and the runtime's open (a link approved, then repointed).
    allow_world_writable_dirs: bool = False
    # Floor rules lifted for this policy alone (floor.py): each is logged at start.
    unsafe: dict[FloorRule, bool] = {}

    @model_validator(mode="before")
    @classmethod
    def _not_a_denylist(cls, data: Any) -> Any:
        """A setting of the old denylist design names what replaces it (CHANGELOG.md)."""
        if isinstance(data, dict):
            for old, new in REPLACED.items():
                if old in data:
                    raise ValueError(
                        f"{old} is no longer a setting: grants are denied unless declared, with {new}"
                    )
        return data

    def lifted(self) -> list[str]:
        return sorted(rule for rule, on in self.unsafe.items() if on)


# Settings of the denylist design (before issue 41), each with the setting that replaces it.
REPLACED = {
    "device_path_prefixes": "device_nodes (host path globs, e.g. /dev/nvidia*)",
    "mount_path_prefixes": "mounts (host path globs, e.g. /opt/vendor/**)",
    "env_name_pattern": "envs (the names allowed, e.g. [SIM_DEVICES, NVIDIA_*])",
    "denied_env_names": "envs (an allowlist) and the floor's rules (unsafe)",
    "denied_device_numbers": "device_nodes (an allowlist) and the floor's rules (unsafe)",
    "denied_container_path_prefixes": "the floor's container_path.system rule (unsafe)",
    "cdi_vendor_prefixes": "cdi_kinds (e.g. [example.com/gpu])",
}

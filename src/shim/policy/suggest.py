"""The declaration grants need: what a policy must allow for the grants a driver made."""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Any

from shim.model import ContainerGrant

from .floor import Floor
from .paths import normal

_NO_FLOOR_LIFTED = Floor(())


class Suggestion:
    """What grants needed, gathered as they are made: the allowlist to paste into a driver's
    policy (``devshim compat --suggest-policy``), and the floor rules they broke, which no
    suggestion lifts (that is the operator's call, with ``unsafe``)."""

    def __init__(self) -> None:
        self.envs: set[str] = set()
        self.device_nodes: set[str] = set()
        self.block = False
        self.mounts: set[str] = set()
        self.writable_mounts = False
        self.cdi_kinds: set[str] = set()
        self.annotation_keys: set[str] = set()
        self.floor: dict[str, set[str]] = {}  # rule -> the values that broke it
        self.resources: set[str] = set()  # what the driver declared, where settings did not say
        self.refused = 0  # grants the policy refused

    def add(self, grant: ContainerGrant) -> None:
        floor = _NO_FLOOR_LIFTED
        for name in grant.envs:
            self._note(floor.env_rule(name), name, self.envs)
        for node in grant.device_nodes:
            path = normal(node.host_path)
            self._note(floor.device_path_rule(path), path, self.device_nodes)
            with contextlib.suppress(OSError):
                self.block |= stat.S_ISBLK(os.stat(path).st_mode)
        for mount in grant.mounts:
            path = normal(mount.host_path)
            self._note(floor.mount_rule(path), path, self.mounts)
            self.writable_mounts |= not mount.read_only
        for name in grant.cdi_devices:
            self.cdi_kinds.add(name.partition("=")[0])
        self.annotation_keys.update(grant.annotations)

    def _note(self, rule: Any, value: str, allowed: set[str]) -> None:
        if rule is None:
            allowed.add(value)
        else:
            self.floor.setdefault(rule.name, set()).add(value)

    def policy(self) -> dict[str, Any]:
        """The declaration, as a drivers[].policy mapping: only the keys that allow something."""
        found: dict[str, Any] = {
            "envs": sorted(self.envs),
            "device_nodes": sorted(self.device_nodes),
            "mounts": sorted(self.mounts),
            "cdi_kinds": sorted(self.cdi_kinds),
            "annotation_key_prefixes": sorted(self.annotation_keys),
        }
        policy = {key: value for key, value in found.items() if value}
        if self.block:
            policy["device_node_types"] = ["char", "block"]
        if self.writable_mounts:
            policy["read_only_mounts"] = False
        return policy

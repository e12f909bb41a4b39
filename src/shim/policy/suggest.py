"""The declaration grants need: what a policy must allow for the grants a driver made."""

from __future__ import annotations

import os
import stat
from typing import Any

from shim.model import ContainerGrant

from .floor import Floor, Rule
from .paths import Looks, normal, resolve
from .settings import CDI_ANNOTATION_PREFIX, ENV_NAME, cdi_kind

_NO_FLOOR_LIFTED = Floor(())


class Suggestion:
    """What grants needed, gathered as they are made: the allowlist to paste into a driver's
    policy (``devshim compat --suggest-policy``), and the floor rules they broke, which no
    suggestion lifts (that is the operator's call, with ``unsafe``). Host paths are looked up
    as the check does: where a link leads is suggested too. What no declaration could allow
    (a malformed name, a relative path) is left out: the check refuses it whatever is declared."""

    def __init__(self) -> None:
        self.envs: set[str] = set()
        self.device_nodes: set[str] = set()
        self.block = False
        self.mounts: set[str] = set()
        self.writable_mounts = False
        self.world_writable = False  # a host path reached through a directory anyone may write to
        self.cdi_kinds: set[str] = set()
        self.annotation_keys: set[str] = set()
        self.floor: dict[str, set[str]] = {}  # rule -> the values that broke it
        self.resources: set[str] = set()  # what the driver declared, where settings did not say
        self.refused = 0  # grants the policy refused

    def add(self, grant: ContainerGrant) -> None:
        floor, looks = _NO_FLOOR_LIFTED, Looks()
        for name in grant.envs:
            if ENV_NAME.fullmatch(name) and not self._broke(floor.env_rule(name), name):
                self.envs.add(name)
        for node in grant.device_nodes:
            self._container_path(node.container_path)
            found = self._host_path(node.host_path, True, looks)
            self.block |= found is not None and stat.S_ISBLK(found.st_mode)
        for mount in grant.mounts:
            self._container_path(mount.container_path)
            self._host_path(mount.host_path, False, looks)
            self.writable_mounts |= not mount.read_only
        cdi = list(grant.cdi_devices)
        for key, value in grant.annotations.items():
            if key:
                self.annotation_keys.add(key)
            if key.startswith(CDI_ANNOTATION_PREFIX):  # held to cdi_kinds as cdi_devices are
                cdi.extend(name.strip() for name in value.split(","))
        self.cdi_kinds.update(kind for name in cdi if (kind := cdi_kind(name)) is not None)

    def _host_path(self, path: str, device: bool, looks: Looks) -> os.stat_result | None:
        """Note ``path`` as written and where it leads, or the floor rule either breaks; what is
        there, if anything."""
        if not path.startswith("/") or "\x00" in path:
            return None
        floor = _NO_FLOOR_LIFTED
        rule_of = floor.device_path_rule if device else floor.mount_rule
        written = normal(path)
        try:
            real, found, links = resolve(path, looks)
        except OSError:  # a link devshim may not read: the check refuses it
            return None
        rule = rule_of(written) or rule_of(real) or (floor.node_rule(found, looks) if device else None)
        if self._broke(rule, written):
            return None
        # Said in the declaration, so that the operator sees it: better, move the path.
        self.world_writable |= any(looks.world_writable(d) for d in (real.rpartition("/")[0] or "/", *links))
        (self.device_nodes if device else self.mounts).update((written, real))
        return found

    def _container_path(self, path: str) -> None:
        if path.startswith("/"):
            self._broke(_NO_FLOOR_LIFTED.container_path_rule(normal(path)), path)

    def _broke(self, rule: Rule | None, value: str) -> bool:
        """Note ``value`` under the floor ``rule`` it broke, if any."""
        if rule is not None:
            self.floor.setdefault(rule.name, set()).add(value)
        return rule is not None

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
        if self.world_writable:
            policy["allow_world_writable_dirs"] = True
        return policy

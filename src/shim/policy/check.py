"""The grant policy: a grant holds only what its operator declared, above the floor.

A driver is a program devshim runs but does not trust with the node: whatever it grants, the
kubelet hands to the container runtime, which opens host paths and honours environment
variables and annotations on the driver's word. ``core/resource.py`` checks every grant of every
source here before the kubelet sees it; a grant outside the policy fails Allocate with
PERMISSION_DENIED naming the field, the rule, and the setting that would allow it.

Host paths are checked twice: normalised as written, and with symlinks resolved as devshim
sees the node's filesystem, on every call (a symlink can change between two Allocates, so that
verdict is never cached): where a path leads must be declared too, be reached through no
directory anyone may write to, break no floor rule and, for a device node, be a device of an
allowed type; a path through a link devshim may not read leads nowhere known, and is refused.
What the grant itself says is judged once per grant object: grants are immutable,
and a declared grant is the same object on every Allocate. The runtime opens the path later
still; the check cannot close that window, so whoever can change symlinks under a declared
path must be trusted (docs/reliability.md).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from typing import NamedTuple

from shim.errors import GrantRefused
from shim.incremental import PerObject
from shim.model import ContainerGrant, Mount

from .floor import Floor, Rule
from .paths import PROC_DEVICES, Globs, Looks, normal, resolve, what
from .settings import CDI_ANNOTATION_PREFIX, ENV_NAME, GrantPolicySettings, cdi_kind
from .suggest import Suggestion

# The cgroup device access letters; static grants are held to the same rule by their settings.
_PERMISSIONS = re.compile(r"[rwm]{1,3}")
_TYPES = {"char": stat.S_IFCHR, "block": stat.S_IFBLK}


class _Refusal(Exception):
    """Why a value is refused, and the config that would allow it; raised as GrantRefused."""


class _HostPath(NamedTuple):
    """A host path the grant names, allowed as written; where it leads is judged on every call."""

    field: str
    path: str
    kind: str  # "device_nodes" or "mounts"


class GrantPolicy:
    """One resource's policy; ``check`` raises GrantRefused for the first field outside it.

    ``where`` is the setting the policy was read from (``drivers[sim].policy``), so that a
    refusal names the line that would allow what it refused."""

    def __init__(
        self,
        resource: str,
        settings: GrantPolicySettings | None = None,
        where: str = "policy",
        *,
        declared: bool = True,
        suggestion: Suggestion | None = None,
        proc_devices: str = PROC_DEVICES,
    ) -> None:
        self.resource = resource
        self.where = where
        # False: the allowlists are not held (the floor still is): `devshim compat` learning
        # what a driver grants, in its own sandbox, to suggest the declaration.
        self.declared = declared
        self.suggestion = suggestion
        self.proc_devices = proc_devices  # the kernel's drivers by major (a test's copy)
        self.settings = settings = settings or GrantPolicySettings()
        self.floor = Floor(settings.lifted())
        self._envs = re.compile("|".join(_env_regex(e) for e in settings.envs) or "(?!)")
        self._devices = Globs(settings.device_nodes)
        self._mounts = Globs(settings.mounts)
        types = settings.device_node_types
        self._types = None if types is None else frozenset(_TYPES[t] for t in types)
        self._cdi = tuple(settings.cdi_kinds)
        self._annotations = tuple(settings.annotation_key_prefixes)
        # What a grant says, judged once per grant object: grants are frozen, and this policy's
        # settings never change (a changed config builds a new policy). Where its host paths
        # lead is not kept: check() resolves them on every call. A refused grant keeps
        # nothing, so it is refused again next time.
        self._judged = PerObject(self._judge)

    def watched(self, suggestion: Suggestion, declared: bool = True) -> GrantPolicy:
        """This policy, noting every grant it judges in ``suggestion``."""
        return GrantPolicy(
            self.resource,
            self.settings,
            self.where,
            declared=declared,
            suggestion=suggestion,
            proc_devices=self.proc_devices,
        )

    def check(self, grant: ContainerGrant) -> None:
        """Raise GrantRefused for the first field outside the policy: what the grant says first
        (judged once per grant object), then where its host paths lead now."""
        if self.suggestion is None:
            return self._check(grant)
        self.suggestion.add(grant)
        try:
            self._check(grant)
        except GrantRefused:
            self.suggestion.refused += 1
            raise

    def _check(self, grant: ContainerGrant) -> None:
        host_paths = self._judged(grant)
        if not host_paths:
            return
        looks = Looks(self.proc_devices)  # afresh on every call: symlinks and modes change
        for host_path in host_paths:
            try:
                self._check_resolved(host_path, looks)
            except _Refusal as refusal:
                raise self._refused(
                    host_path.field, host_path.path, f"{host_path.kind}.host_path", refusal
                ) from None

    def check_as_written(self, grant: ContainerGrant) -> None:
        """Raise GrantRefused for anything the grant says outside the policy, without looking at
        the filesystem (a static grant, checked when the config loads)."""
        self._judge(grant)

    def _refused(self, field: str, value: str, kind: str, refusal: _Refusal) -> GrantRefused:
        return GrantRefused(self.resource, field, value, str(refusal), kind)

    def _floor(self, rule: Rule) -> _Refusal:
        return _Refusal(
            f"the floor's rule {rule.name} refuses it ({rule.why}); only "
            f"{self.where}.unsafe: {{{rule.name}: true}} lifts it"
        )

    def _undeclared(self, setting: str, example: str) -> _Refusal:
        return _Refusal(f"not declared: {self.where}.{setting} would allow it, e.g. [{_cut(example)}]")

    def _must_declare(self, allowed: bool, setting: str, example: str) -> None:
        if not allowed and self.declared:
            raise self._undeclared(setting, example)

    def _judge(self, grant: ContainerGrant) -> tuple[_HostPath, ...]:
        """Check everything the grant says; return its host paths, to resolve on every call."""
        host_paths = []
        for i, node in enumerate(grant.device_nodes):
            where = f"device_nodes[{i}]"
            for field, value, kind, check in (
                (f"{where}.host_path", node.host_path, "device_nodes.host_path", self._device_path),
                (f"{where}.container_path", node.container_path, "device_nodes.container_path",
                 self._container_path),
                (f"{where}.permissions", node.permissions, "device_nodes.permissions", _permissions),
            ):  # fmt: skip
                try:
                    check(value)
                except _Refusal as refusal:
                    raise self._refused(field, value, kind, refusal) from None
            host_paths.append(_HostPath(f"{where}.host_path", node.host_path, "device_nodes"))
        for i, mount in enumerate(grant.mounts):
            host_paths.append(self._mount(f"mounts[{i}]", mount))
        for name in grant.envs:
            try:
                self._env(name)
            except _Refusal as refusal:
                raise self._refused(f"envs[{_cut(name)!r}]", name, "envs", refusal) from None
        for key, value in grant.annotations.items():
            try:
                self._annotation(key, value)
            except _Refusal as refusal:
                raise self._refused(f"annotations[{_cut(key)!r}]", key, "annotations", refusal) from None
        for i, name in enumerate(grant.cdi_devices):
            try:
                self._cdi_name(name)
            except _Refusal as refusal:
                raise self._refused(f"cdi_devices[{i}]", name, "cdi_devices", refusal) from None
        return tuple(host_paths)

    def _mount(self, where: str, mount: Mount) -> _HostPath:
        for field, value, kind, check in (
            (f"{where}.host_path", mount.host_path, "mounts.host_path", self._mount_path),
            (f"{where}.container_path", mount.container_path, "mounts.container_path", self._container_path),
        ):
            try:
                check(value)
            except _Refusal as refusal:
                raise self._refused(field, value, kind, refusal) from None
        if self.settings.read_only_mounts and not mount.read_only and self.declared:
            read_only = _Refusal(f"mounts must be read-only ({self.where}.read_only_mounts)")
            raise self._refused(f"{where}.read_only", "false", "mounts.read_only", read_only)
        return _HostPath(f"{where}.host_path", mount.host_path, "mounts")

    def _env(self, name: str) -> None:
        if not ENV_NAME.fullmatch(name):
            raise _Refusal("not an env name (letters, digits and '_', not starting with a digit)")
        if (rule := self.floor.env_rule(name)) is not None:
            raise self._floor(rule)
        self._must_declare(self._envs.fullmatch(name) is not None, "envs", name)

    def _device_path(self, path: str) -> None:
        self._host_path(path, self.floor.device_path_rule, self._devices, "device_nodes")

    def _mount_path(self, path: str) -> None:
        self._host_path(path, self.floor.mount_rule, self._mounts, "mounts")

    def _host_path(
        self, path: str, floor_rule: Callable[[str], Rule | None], globs: Globs, setting: str
    ) -> None:
        """A host path as written: absolute, clear of the floor and declared in ``setting``, both
        judged on its normal form."""
        _absolute(path)
        written = normal(path)
        if (rule := floor_rule(written)) is not None:
            raise _normalised(path, written, self._floor(rule))
        try:
            self._must_declare(globs.cover(written), setting, written)
        except _Refusal as refusal:
            raise _normalised(path, written, refusal) from None

    def _container_path(self, path: str) -> None:
        _absolute(path)
        if ".." in path.split("/"):
            raise _Refusal("'..' in a container path")
        if (rule := self.floor.container_path_rule(normal(path))) is not None:
            raise self._floor(rule)

    def _annotation(self, key: str, value: str) -> None:
        self._must_declare(key.startswith(self._annotations), "annotation_key_prefixes", key)
        # A CDI annotation grants devices just as cdi_devices does: the same kinds only.
        if key.startswith(CDI_ANNOTATION_PREFIX):
            for name in value.split(","):
                self._cdi_name(name.strip())

    def _cdi_name(self, name: str) -> None:
        kind = cdi_kind(name)
        if kind is None:
            raise _Refusal("not a CDI device name 'vendor/class=name'")
        vendor = kind.partition("/")[0]
        allowed = any(k in ("*", kind) or (k.endswith("/*") and vendor == k[:-2]) for k in self._cdi)
        self._must_declare(allowed, "cdi_kinds", kind)

    def _check_resolved(self, host_path: _HostPath, looks: Looks) -> None:
        try:
            real, found, links = resolve(host_path.path, looks)
        except OSError as error:  # a link devshim may not read (another namespace's /proc/PID/root)
            raise _Refusal(f"where it leads cannot be looked up ({error.strerror})") from None
        device = host_path.kind == "device_nodes"
        globs = self._devices if device else self._mounts
        if real != normal(host_path.path):
            rule = self.floor.device_path_rule(real) if device else self.floor.mount_rule(real)
            if rule is not None:
                raise _Refusal(f"it resolves to {_cut(real)!r}, which {self._floor(rule)}")
            if not globs.cover(real) and self.declared:
                raise _Refusal(
                    f"it resolves to {_cut(real)!r}, which is not declared in {self.where}.{host_path.kind}"
                )
        if not self.settings.allow_world_writable_dirs and self.declared:
            for directory in (real.rpartition("/")[0] or "/", *links):
                if writable := looks.world_writable(directory):
                    raise _Refusal(
                        f"it passes through {_cut(writable)!r}, which anyone may write to "
                        f"({self.where}.allow_world_writable_dirs)"
                    )
        if device:
            self._check_node(real, found, looks)

    def _check_node(self, real: str, found: os.stat_result | None, looks: Looks) -> None:
        kind = stat.S_IFMT(found.st_mode) if found is not None else 0
        there = f"{_cut(real)!r} {what(found)}"
        if self._types is not None and kind not in self._types and self.declared:
            shown = " or ".join(sorted(self.settings.device_node_types or ())) or "no"
            raise _Refusal(f"{there}, and {self.where}.device_node_types allows {shown} devices only")
        if (rule := self.floor.node_rule(found, looks)) is not None:
            raise _Refusal(f"{there}, which {self._floor(rule)}")


def _env_regex(entry: str) -> str:
    return re.escape(entry[:-1]) + "[A-Za-z0-9_]*" if entry.endswith("*") else re.escape(entry)


def _normalised(path: str, written: str, refusal: _Refusal) -> _Refusal:
    return refusal if written == path else _Refusal(f"it normalises to {_cut(written)!r}, {refusal}")


def _cut(value: str) -> str:
    """A value a driver chose, as a refusal quotes it: cut short, as GrantRefused cuts the
    value it names (gRPC details travel in a header block of a few KiB)."""
    return value if len(value) <= 200 else value[:200] + "..."


def _absolute(path: str) -> None:
    if "\x00" in path:
        raise _Refusal("a NUL byte in a path")
    if not path.startswith("/"):
        raise _Refusal("not an absolute path")


def _permissions(value: str) -> None:
    if not _PERMISSIONS.fullmatch(value):
        raise _Refusal("not 1-3 of r, w, m")

"""The grant policy: what a resource's device source may grant a container.

A driver is a program devshim runs but does not trust with the node: whatever it grants, the
kubelet hands to the container runtime, which opens host paths and honours environment
variables and annotations on the driver's word. The operator states per resource what is
allowed (``GrantPolicySettings``, part of devshim's settings); ``core/resource.py`` checks every
grant of every source here before the kubelet sees it, and a grant outside the policy fails
Allocate with PERMISSION_DENIED naming the field (docs/configuration.md, "Grant policy").

Host paths are checked twice: normalised as written, and with symlinks resolved as devshim
sees the node's filesystem, on every call (a symlink can change between two Allocates, so that
verdict is never cached). What the grant itself says is judged once per grant object: grants are
immutable, and a declared grant is the same object on every Allocate. The runtime opens the path
later still; the check cannot close that window, so whoever can change symlinks under an
allowed prefix must be trusted (docs/reliability.md).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Sequence
from typing import Annotated, NamedTuple

from pydantic import AfterValidator, Field

from shim.configfile import StrictModel
from shim.errors import GrantRefused
from shim.incremental import PerObject
from shim.model import ContainerGrant, Mount

# The cgroup device access letters; static grants are held to the same rule by their settings.
_PERMISSIONS = re.compile(r"[rwm]{1,3}")
# Annotations containerd and CRI-O read as CDI device names (comma-separated).
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"


def _path_prefix(value: str) -> str:
    """An allowed host path prefix: absolute, without NUL or '..', normalised."""
    if "\x00" in value:
        raise ValueError("a path prefix must not contain a NUL byte")
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r} must not contain '..'")
    # normpath keeps a leading '//' (POSIX leaves its meaning open); on Linux it is '/'.
    return "/" + posixpath.normpath(value).lstrip("/")


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a valid regular expression: {exc}") from None
    return value


PathPrefix = Annotated[str, AfterValidator(_path_prefix)]
DENIED_ENV_NAMES = (
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "BASH_ENV", "ENV", "NODE_OPTIONS",
    "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME",
    "PERL5OPT", "PERL5LIB", "RUBYOPT", "RUBYLIB", "PATH",
)  # fmt: skip
DENIED_CONTAINER_PATH_PREFIXES = (
    "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/bin", "/sbin", "/boot", "/proc", "/sys",
)  # fmt: skip
# A CDI vendor ("example.com") or a vendor and class ("example.com/gpu").
CdiKindPrefix = Annotated[str, Field(pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*(/[A-Za-z0-9][-A-Za-z0-9_.]*)?$")]


class GrantPolicySettings(StrictModel):
    """What a resource's source may grant; anything else fails Allocate (docs/configuration.md,
    "Grant policy"). The defaults allow device nodes under /dev only."""

    # Host paths of device nodes and of mounts must lie under one of these, both as written
    # (normalised) and with symlinks resolved; matched on whole path components.
    device_path_prefixes: list[PathPrefix] = ["/dev"]
    mount_path_prefixes: list[PathPrefix] = []
    read_only_mounts: bool = True
    env_name_pattern: Annotated[str, AfterValidator(_regex)] = r"^[A-Za-z_][A-Za-z0-9_]*$"
    # Variables that make a program in the container load or run code of the driver's choosing:
    # the dynamic loader's hooks, glibc's gconv modules, shells' start-up files, interpreters'
    # option and path variables, and PATH itself (docs/configuration.md, "Grant policy").
    denied_env_names: list[str] = list(DENIED_ENV_NAMES)
    # Container paths (of mounts and device nodes) that must not be at or under these: the
    # loader's and the system's own files (a mount at /etc/ld.so.preload is LD_PRELOAD by another
    # name), and the kernel's interfaces.
    denied_container_path_prefixes: list[PathPrefix] = list(DENIED_CONTAINER_PATH_PREFIXES)
    # Plain string prefixes; null: any key. None by default: container runtimes act on some
    # annotations (cdi.k8s.io/ injects CDI devices, CRI-O's io.kubernetes.cri-o.Devices adds nodes).
    annotation_key_prefixes: list[Annotated[str, Field(min_length=1)]] | None = []
    # None: any CDI device name; a list: only names of these vendors or vendor/classes.
    cdi_vendor_prefixes: list[CdiKindPrefix] | None = None


class _Prefixes:
    """Allowed host path prefixes, matched on whole components (/dev allows /dev/x, not /devil)."""

    def __init__(self, prefixes: Sequence[str]) -> None:
        self.shown = ", ".join(prefixes) or "none"
        # The prefixes themselves are resolved once, here: the operator chose them, and only
        # root on the host could repoint one. What lies under them is resolved on every call.
        # A prefix that is a symlink (/var/run -> /run) also allows where it leads.
        self.resolved = {p: os.path.realpath(p) for p in prefixes}
        every = dict.fromkeys([*prefixes, *self.resolved.values()])
        self._under = tuple(p.rstrip("/") + "/" for p in every)
        self._exact = frozenset(every)

    def __bool__(self) -> bool:
        return bool(self._exact)

    def cover(self, path: str) -> bool:
        return path in self._exact or path.startswith(self._under)


def _normal(path: str) -> str:
    # normpath keeps a leading '//' (POSIX leaves its meaning open); on Linux it is '/'.
    return "/" + posixpath.normpath(path).lstrip("/")


def _resolve(path: str, prefixes: _Prefixes, parents: dict[str, str]) -> str:
    """``os.path.realpath(path)``, resolving each parent directory once per check (or not at
    all when it is an allowed prefix): a grant of eight nodes in /dev costs eight lstat calls
    instead of sixteen."""
    head, _, tail = path.rpartition("/")
    if not head or tail in ("", ".", "..") or "//" in path or "/./" in path or "/../" in path:
        return os.path.realpath(path)
    parent = prefixes.resolved.get(head) or parents.get(head)
    if parent is None:
        parent = parents[head] = os.path.realpath(head)
    try:
        link = stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:  # absent (or unreadable): nothing more to follow, as realpath does
        link = False
    return os.path.realpath(path) if link else parent.rstrip("/") + "/" + tail


class _HostPath(NamedTuple):
    """A host path the grant names, within its prefixes as written; resolved on every call."""

    field: str
    path: str
    normal: str
    prefixes: _Prefixes
    kind: str

    def resolved_problem(self, parents: dict[str, str]) -> str | None:
        # Resolved from the path as written: the kernel follows a symlink before a later '..',
        # which normpath would have cancelled lexically (/dev/link/../x).
        real = _resolve(self.path, self.prefixes, parents)
        if real != self.normal and not self.prefixes.cover(real):
            return f"it resolves to {real!r}, not under an allowed prefix ({self.prefixes.shown})"
        return None


def _host_path_problem(path: str, prefixes: _Prefixes) -> str | None:
    """What is wrong with ``path`` as written (symlinks aside), if anything."""
    if "\x00" in path:
        return "a NUL byte in a path"
    if not path.startswith("/"):
        return "not an absolute path"
    normal = _normal(path)
    if not prefixes.cover(normal):
        normalised = f"it normalises to {normal!r}, " if normal != path else ""
        return f"{normalised}not under an allowed prefix ({prefixes.shown})"
    return None


def _container_path_problem(path: str) -> str | None:
    if "\x00" in path:
        return "a NUL byte in a path"
    if not path.startswith("/"):
        return "not an absolute path"
    if ".." in path.split("/"):
        return "'..' in a container path"
    return None


class GrantPolicy:
    """One resource's policy; ``check`` raises GrantRefused for the first field outside it."""

    def __init__(self, resource: str, settings: GrantPolicySettings | None = None) -> None:
        self.resource = resource
        self.settings = settings = settings or GrantPolicySettings()
        self._devices = _Prefixes(settings.device_path_prefixes)
        self._system = tuple(settings.denied_container_path_prefixes)
        self._mounts = _Prefixes(settings.mount_path_prefixes)
        self._env_name = re.compile(settings.env_name_pattern)
        self._denied_envs = frozenset(settings.denied_env_names)
        keys = settings.annotation_key_prefixes
        self._annotation_prefixes = None if keys is None else tuple(keys)
        self._cdi = None if settings.cdi_vendor_prefixes is None else tuple(settings.cdi_vendor_prefixes)
        self._judged = PerObject(self._judge)

    def _refuse(self, field: str, value: str, rule: str, kind: str) -> GrantRefused:
        return GrantRefused(self.resource, field, value, rule, kind)

    def check(self, grant: ContainerGrant) -> None:
        """Raise GrantRefused for the first field outside the policy: what the grant says first
        (judged once per grant object), then where its host paths lead now."""
        parents: dict[str, str] = {}  # resolved afresh on every call: symlinks change
        for host_path in self._judged(grant):
            if problem := host_path.resolved_problem(parents):
                raise self._refuse(host_path.field, host_path.path, problem, host_path.kind)

    def check_as_written(self, grant: ContainerGrant) -> None:
        """Raise GrantRefused for anything the grant says outside the policy, without looking at
        the filesystem (a static grant, checked when the config loads)."""
        self._judge(grant)

    def _judge(self, grant: ContainerGrant) -> tuple[_HostPath, ...]:
        """Check everything the grant says; return its host paths, to resolve on every call."""
        host_paths = []
        for i, node in enumerate(grant.device_nodes):
            where = f"device_nodes[{i}]"
            host_path = self._host_path(f"{where}.host_path", node.host_path, self._devices, "device_nodes")
            host_paths.append(host_path)
            if problem := self._container_path_problem(node.container_path):
                raise self._refuse(
                    f"{where}.container_path", node.container_path, problem, "device_nodes.container_path"
                )
            if not _PERMISSIONS.fullmatch(node.permissions):
                raise self._refuse(
                    f"{where}.permissions", node.permissions, "not 1-3 of r, w, m", "device_nodes.permissions"
                )
        for i, mount in enumerate(grant.mounts):
            host_paths.append(self._mount(f"mounts[{i}]", mount))
        for name in grant.envs:
            self._check_env(name)
        for key, value in grant.annotations.items():
            self._check_annotation(key, value)
        for i, name in enumerate(grant.cdi_devices):
            if problem := self._cdi_problem(name):
                raise self._refuse(f"cdi_devices[{i}]", name, problem, "cdi_devices")
        return tuple(host_paths)

    def _host_path(self, field: str, path: str, prefixes: _Prefixes, kind: str) -> _HostPath:
        if problem := _host_path_problem(path, prefixes):
            raise self._refuse(field, path, problem, f"{kind}.host_path")
        return _HostPath(field, path, _normal(path), prefixes, f"{kind}.host_path")

    def _mount(self, where: str, mount: Mount) -> _HostPath:
        if not self._mounts:
            rule = "no mounts allowed (mount_path_prefixes is empty)"
            raise self._refuse(f"{where}.host_path", mount.host_path, rule, "mounts.host_path")
        host_path = self._host_path(f"{where}.host_path", mount.host_path, self._mounts, "mounts")
        if problem := self._container_path_problem(mount.container_path):
            raise self._refuse(
                f"{where}.container_path", mount.container_path, problem, "mounts.container_path"
            )
        if self.settings.read_only_mounts and not mount.read_only:
            rule = "mounts must be read-only (read_only_mounts)"
            raise self._refuse(f"{where}.read_only", "false", rule, "mounts.read_only")
        return host_path

    def _container_path_problem(self, path: str) -> str | None:
        if problem := _container_path_problem(path):
            return problem
        normal = _normal(path)
        if normal == "/":
            return "the container's root"
        for prefix in self._system:
            if normal == prefix or normal.startswith(prefix.rstrip("/") + "/"):
                return f"under {prefix}, a loader or system location (denied_container_path_prefixes)"
        return None

    def _check_env(self, name: str) -> None:
        if name in self._denied_envs:
            raise self._refuse(f"envs[{name!r}]", name, "a denied name (denied_env_names)", "envs")
        if not self._env_name.fullmatch(name):
            raise self._refuse(
                f"envs[{name!r}]", name, f"does not match env_name_pattern {self._env_name.pattern!r}", "envs"
            )

    def _check_annotation(self, key: str, value: str) -> None:
        if self._annotation_prefixes is not None and not key.startswith(self._annotation_prefixes):
            allowed = ", ".join(self._annotation_prefixes) or "none"
            raise self._refuse(
                f"annotations[{key!r}]", key, f"not under an allowed key prefix ({allowed})", "annotations"
            )
        # A CDI annotation grants devices just as cdi_devices does: the same vendors only.
        if key.startswith(CDI_ANNOTATION_PREFIX):
            for name in value.split(","):
                if problem := self._cdi_problem(name.strip()):
                    raise self._refuse(f"annotations[{key!r}]", name, problem, "annotations")

    def _cdi_problem(self, name: str) -> str | None:
        if self._cdi is None:
            return None
        kind, equals, device = name.partition("=")
        vendor, slash, device_class = kind.partition("/")
        if not (equals and device and vendor and slash and device_class):
            return "not a CDI device name 'vendor/class=name'"
        if not any(kind == p or kind.startswith(p + "/") for p in self._cdi):
            return f"not of an allowed CDI vendor ({', '.join(self._cdi) or 'none'})"
        return None

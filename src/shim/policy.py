"""The grant policy: what a resource's device source may grant a container.

A driver is a program devshim runs but does not trust with the node: whatever it grants, the
kubelet hands to the container runtime, which opens host paths and honours environment
variables and annotations on the driver's word. The operator states per resource what is
allowed (``GrantPolicySettings``, part of devshim's settings); ``core/resource.py`` checks every
grant of every source here before the kubelet sees it, and a grant outside the policy fails
Allocate with PERMISSION_DENIED naming the field (docs/configuration.md, "Grant policy").

Host paths are checked twice: normalised as written, and with symlinks resolved as devshim
sees the node's filesystem, on every call (a symlink can change between two Allocates, so that
verdict is never cached): where a path leads must lie under an allowed prefix, be reached through
no directory anyone may write to, and, for a device node, be a device of an allowed type and
number. What the grant itself says is judged once per grant object: grants are
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
from typing import Annotated, Literal, NamedTuple

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
# Character devices no container needs from a device plugin, as the cgroup writes them
# ("c major:minor", "*" for any): physical memory and I/O ports (mem, kmem, port), the kernel's
# log (kmsg: read it, or forge lines in it), the host's consoles and their screens (tty0-63 and
# serial ttyS*, console, vcs*: keystrokes typed into the host), device-mapper's and loop's
# control nodes (a block device made of any disk), SCSI generic (raw commands to any disk),
# CPU model-specific registers (msr), the hibernation image (snapshot: all of memory), the
# watchdog (reboots the node when closed wrongly). Numbers from the kernel's devices.txt.
DENIED_DEVICE_NUMBERS = (
    "c 1:1", "c 1:2", "c 1:4", "c 1:11", "c 4:*", "c 5:1", "c 7:*", "c 10:130", "c 10:231",
    "c 10:236", "c 10:237", "c 21:*", "c 202:*",
)  # fmt: skip
DeviceNumber = Annotated[str, Field(pattern=r"^[cb] ([0-9]+|\*):([0-9]+|\*)$")]
# A CDI vendor ("example.com") or a vendor and class ("example.com/gpu"); "*": any vendor.
CdiKindPrefix = Annotated[
    str, Field(pattern=r"^(\*|[A-Za-z0-9][-A-Za-z0-9_.]*(/[A-Za-z0-9][-A-Za-z0-9_.]*)?)$")
]


class GrantPolicySettings(StrictModel):
    """What a resource's source may grant; anything else fails Allocate (docs/configuration.md,
    "Grant policy"). The defaults allow character devices under /dev only."""

    # Host paths of device nodes and of mounts must lie under one of these, both as written
    # (normalised) and with symlinks resolved; matched on whole path components.
    device_path_prefixes: list[PathPrefix] = ["/dev"]
    # What a device node's host path must be, links followed, when devshim looks: a block device
    # is a disk (the host's root among them), and /dev itself or a regular file is no device.
    # null: anything, even a path that does not exist.
    device_node_types: list[Literal["char", "block"]] | None = ["char"]
    denied_device_numbers: list[DeviceNumber] = list(DENIED_DEVICE_NUMBERS)
    # A host path below a world-writable directory (/dev/shm, /tmp) can be replaced by anyone
    # between devshim's check and the runtime's open (a link approved, then repointed).
    allow_world_writable_dirs: bool = False
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
    # None: names in the resource's own vendor domain (example.com/gpu: CDI vendors example.com
    # and its parent domains, such as a.example.com/x: example.com); a list: only these vendors
    # or vendor/classes; ["*"]: any CDI device name.
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


def _resolve(
    path: str, prefixes: _Prefixes, looks: _Looks
) -> tuple[str, os.stat_result | None, tuple[str, ...]]:
    """Where ``path`` leads, what is there (None: nothing), and the directories of the links
    followed on the way. Each parent directory is resolved once per check (or not at all when
    it is an allowed prefix): a grant of eight nodes in /dev costs eight lstat calls."""
    head, _, tail = path.rpartition("/")
    links: tuple[str, ...] = ()
    if not head or tail in ("", ".", "..") or "//" in path or "/./" in path or "/../" in path:
        real, links = looks.follow(path)
        return real, _stat(real), links
    parent = prefixes.resolved.get(head)
    if parent is None:
        parent, links = looks.follow(head)
    try:
        here = os.lstat(path)
    except OSError:  # absent (or unreadable): nothing more to follow
        return parent.rstrip("/") + "/" + tail, None, links
    if stat.S_ISLNK(here.st_mode):
        real, links = looks.follow(path)
        return real, _stat(real), links
    return parent.rstrip("/") + "/" + tail, here, links


def _follow(path: str) -> tuple[str, tuple[str, ...]]:
    """``os.path.realpath(path)`` as the kernel walks it, with the directory of each link on the
    way: whoever may write there may repoint the link."""
    links: list[str] = []
    todo = [name for name in reversed(path.split("/")) if name]
    done = "/"
    while todo:  # ends: at most 40 links are followed, as the kernel allows (ELOOP)
        name = todo.pop()
        if name == "." or name == "..":
            done = posixpath.dirname(done) if name == ".." else done
            continue
        here = posixpath.join(done, name)
        try:
            link = stat.S_ISLNK(os.lstat(here).st_mode)
        except OSError:  # nothing there: the rest as written
            link = False
        if not link or len(links) >= 40:
            done = here
            continue
        links.append(done)
        target = os.readlink(here)
        done = "/" if target.startswith("/") else done
        todo.extend(name for name in reversed(target.split("/")) if name)
    return done, tuple(links)


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _what(found: os.stat_result | None) -> str:
    if found is None:
        return "does not exist"
    mode = found.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "character" if stat.S_ISCHR(mode) else "block"
        return f"is a {kind} device {os.major(found.st_rdev)}:{os.minor(found.st_rdev)}"
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO"),
    ):
        if test(mode):
            return f"is {name}"
    return "is a socket"


class _Looks:
    """What one check learnt of the filesystem: never kept past it, since it can change."""

    def __init__(self) -> None:
        self._followed: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._writable: dict[str, str | None] = {}  # directory -> it or the nearest above it
        # that anyone may write to

    def follow(self, path: str) -> tuple[str, tuple[str, ...]]:
        found = self._followed.get(path)
        if found is None:
            found = self._followed[path] = _follow(path)
        return found

    def world_writable(self, directory: str) -> str | None:
        """``directory`` or the nearest one above it that anyone may write to, if any."""
        walked = []
        while directory not in self._writable:
            walked.append(directory)
            found = _stat(directory)
            if found is not None and found.st_mode & stat.S_IWOTH:
                self._writable[directory] = directory
                break
            if directory == "/":
                self._writable[directory] = None
                break
            directory = directory.rpartition("/")[0] or "/"
        answer = self._writable[directory]
        for below in walked:
            self._writable[below] = answer
        return answer


class _NodeRules(NamedTuple):
    """What a device node's host path must be where it leads."""

    types: frozenset[int] | None  # file types (stat.S_IFCHR, S_IFBLK); None: anything
    shown: str  # the types as configured
    denied: frozenset[tuple[int, int | None, int | None]]  # (file type, major, minor); None: any

    @classmethod
    def of(cls, settings: GrantPolicySettings) -> _NodeRules:
        file_types = {"char": stat.S_IFCHR, "block": stat.S_IFBLK, "c": stat.S_IFCHR, "b": stat.S_IFBLK}
        denied = set()
        for entry in settings.denied_device_numbers:
            kind, _, numbers = entry.partition(" ")
            major, _, minor = numbers.partition(":")
            number = (None if major == "*" else int(major), None if minor == "*" else int(minor))
            denied.add((file_types[kind], *number))
        types = settings.device_node_types
        if types is None:
            return cls(None, "anything", frozenset(denied))
        return cls(
            frozenset(file_types[t] for t in types), " or ".join(sorted(types)) or "no", frozenset(denied)
        )

    def problem(self, real: str, found: os.stat_result | None) -> str | None:
        kind = stat.S_IFMT(found.st_mode) if found is not None else 0
        if self.types is not None and kind not in self.types:
            return f"{real!r} {_what(found)}, and device_node_types allows {self.shown} devices only"
        if found is not None and self.denied and (kind == stat.S_IFCHR or kind == stat.S_IFBLK):
            major, minor = os.major(found.st_rdev), os.minor(found.st_rdev)
            for rule in ((kind, major, minor), (kind, major, None), (kind, None, minor), (kind, None, None)):
                if rule in self.denied:
                    return f"{real!r} {_what(found)}, which denied_device_numbers refuses"
        return None


class _HostPath(NamedTuple):
    """A host path the grant names, within its prefixes as written; resolved on every call."""

    field: str
    path: str
    normal: str
    prefixes: _Prefixes
    kind: str
    nodes: _NodeRules | None  # None: a mount's host path, which may be anything
    world_writable_ok: bool

    def resolved_problem(self, looks: _Looks) -> str | None:
        # Resolved from the path as written: the kernel follows a symlink before a later '..',
        # which normpath would have cancelled lexically (/dev/link/../x).
        real, found, links = _resolve(self.path, self.prefixes, looks)
        if real != self.normal and not self.prefixes.cover(real):
            return f"it resolves to {real!r}, not under an allowed prefix ({self.prefixes.shown})"
        if not self.world_writable_ok:
            for directory in (real.rpartition("/")[0] or "/", *links):
                if writable := looks.world_writable(directory):
                    rule = "which anyone may write to (allow_world_writable_dirs)"
                    return f"it passes through {writable!r}, {rule}"
        return None if self.nodes is None else self.nodes.problem(real, found)


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
        self._nodes = _NodeRules.of(settings)
        self._system = tuple(settings.denied_container_path_prefixes)
        self._mounts = _Prefixes(settings.mount_path_prefixes)
        self._env_name = re.compile(settings.env_name_pattern)
        self._denied_envs = frozenset(settings.denied_env_names)
        keys = settings.annotation_key_prefixes
        self._annotation_prefixes = None if keys is None else tuple(keys)
        cdi = settings.cdi_vendor_prefixes
        self._cdi = _own_domains(resource) if cdi is None else None if "*" in cdi else tuple(cdi)
        self._cdi_rule = "the resource's own vendor domain" if cdi is None else "cdi_vendor_prefixes"
        # What a grant says, judged once per grant object: grants are frozen, and this policy's
        # settings never change (a changed config builds a new policy). An equal grant in another
        # object is judged again. Where its host paths lead is not kept: check() resolves them on
        # every call. A refused grant keeps nothing, so it is refused again next time.
        self._judged = PerObject(self._judge)

    def _refuse(self, field: str, value: str, rule: str, kind: str) -> GrantRefused:
        return GrantRefused(self.resource, field, value, rule, kind)

    def check(self, grant: ContainerGrant) -> None:
        """Raise GrantRefused for the first field outside the policy: what the grant says first
        (judged once per grant object), then where its host paths lead now."""
        looks = _Looks()  # afresh on every call: symlinks and modes change
        for host_path in self._judged(grant):
            if problem := host_path.resolved_problem(looks):
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
            host_path = self._host_path(
                f"{where}.host_path", node.host_path, self._devices, "device_nodes", self._nodes
            )
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

    def _host_path(
        self, field: str, path: str, prefixes: _Prefixes, kind: str, nodes: _NodeRules | None
    ) -> _HostPath:
        if problem := _host_path_problem(path, prefixes):
            raise self._refuse(field, path, problem, f"{kind}.host_path")
        ok = self.settings.allow_world_writable_dirs
        return _HostPath(field, path, _normal(path), prefixes, f"{kind}.host_path", nodes, ok)

    def _mount(self, where: str, mount: Mount) -> _HostPath:
        if not self._mounts:
            rule = "no mounts allowed (mount_path_prefixes is empty)"
            raise self._refuse(f"{where}.host_path", mount.host_path, rule, "mounts.host_path")
        host_path = self._host_path(f"{where}.host_path", mount.host_path, self._mounts, "mounts", None)
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
            return f"not of an allowed CDI vendor ({', '.join(self._cdi) or 'none'}: {self._cdi_rule})"
        return None


def _own_domains(resource: str) -> tuple[str, ...]:
    """The CDI vendors a resource's own domain covers: gpu.example.com/x gives gpu.example.com
    and example.com (a vendor's CDI kind is often its parent domain), never a bare TLD."""
    labels = resource.partition("/")[0].split(".")
    return tuple(".".join(labels[i:]) for i in range(max(len(labels) - 1, 1)))

"""The kubelet releases the upstream judge is built at, and building each on first use.

A release is a folder judges/k8s-1.NN holding a Go module that requires k8s.io/kubernetes at
one patch release (its go.mod says which; go.sum pins everything). Its programs (each a main
package in a subfolder: `devicemanager`, the harness; `kubelet`, the whole kubelet for the real
node of shim.compat.realnode, `kube-apiserver` and `kube-scheduler` for its control plane, and
`dramanager`, the DRA manager's harness (dra_manager.py), in the releases that carry them) are
built into a per-user cache, keyed by the release and a hash of the Go sources (its own and
those of the local modules its go.mod replaces in: ../harness, ../dra), so an upgrade of devshim
rebuilds and a second run reuses. A lock file keeps two runs from building one release at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

JUDGES = Path(__file__).parent / "judges"
HARNESS = JUDGES / "harness"
_REQUIRE = re.compile(r"^\s*(?:require\s+)?k8s\.io/kubernetes (v1\.(\d+)\.\d+\S*)(?:\s*//.*)?$", re.MULTILINE)
# A local module the release's module is built with: "replace devshim.example/judges/dra => ../dra".
_LOCAL_REPLACE = re.compile(r"^\s*(?:replace\s+)?\S+\s+=>\s+\.\./([\w.-]+)\s*$", re.MULTILINE)
# Measured on 2 cores (docs/toolchains.md): about 3.5 minutes and 2 GiB of Go caches per
# release built cold; seconds once Go's caches hold it.
BUILD_MINUTES = 4
BUILD_GIB = 2.5
BUILD_TIMEOUT_S = 1800.0
HARNESS_PROGRAM = "devicemanager"
KUBELET_PROGRAM = "kubelet"
APISERVER_PROGRAM = "kube-apiserver"
SCHEDULER_PROGRAM = "kube-scheduler"  # the connected node's scheduler (shim.compat.realnode.scheduler)
# The kubelet's DRA manager and plugin manager, driven by shim.compat.upstream.dra_manager.
DRAMANAGER_PROGRAM = "dramanager"
ETCD_PROGRAM = "etcd"
DRA_TEST_DRIVER_PROGRAM = "dra-test-driver"
DRA_TEST_DRIVER_PACKAGE = "k8s.io/kubernetes/test/e2e/dra/test-driver"
# The version package the release's programs report (--version, /version): set at link time, as
# the release's own build does; a -X naming a package a program does not link is ignored.
_VERSION_PACKAGE = "k8s.io/component-base/version"
_ETCD_REQUIRE = re.compile(
    r"^\s*(?:require\s+)?go\.etcd\.io/etcd/(client|server)/v3 (v3\.\d+\.\d+)", re.MULTILINE
)
# containerd 2.x for the connected node (CDI): judges/containerd-2.N names the release in go.mod
# and its programs as go.mod `tool` lines; they are built from the module cache, unchanged.
_CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
_CONTAINERD_REQUIRE = re.compile(
    r"^\s*(?:require\s+)?github\.com/containerd/containerd/v2 (v2\.\d+\.\d+)", re.MULTILINE
)
CONTAINERD_PROGRAMS = ("containerd", "containerd-shim-runc-v2", "ctr")


class JudgeUnavailable(RuntimeError):
    """The upstream judge cannot run here; the message says what is missing, in one line."""


@dataclass(frozen=True, order=True)
class Release:
    minor: int
    version: str  # "v1.37.2"
    folder: Path

    @property
    def name(self) -> str:
        """The judge's name for it: "upstream-1.37"."""
        return f"upstream-1.{self.minor}"

    def source_hash(self) -> str:
        """Changes when any Go source the release's programs build from changes: its module's
        and those of the local modules it replaces in (judges/harness, and judges/dra for the
        releases with a dramanager), which its go.mod names."""
        gomod = (self.folder / "go.mod").read_text(encoding="utf-8")
        local = sorted({JUDGES / name for name in _LOCAL_REPLACE.findall(gomod)} | {HARNESS})
        return _source_hash(*local, self.folder)

    def binary(self, program: str = HARNESS_PROGRAM) -> Path:
        return cache_dir() / f"{self.version}-{self.source_hash()}" / program

    def built(self, program: str = HARNESS_PROGRAM) -> bool:
        """The program is in the cache (a cache this user cannot read counts as not built)."""
        try:
            return self.binary(program).is_file()
        except OSError:
            return False

    def carries(self, program: str) -> bool:
        """Whether this release's module has `program` (every one has the harness)."""
        return (self.folder / program / "main.go").is_file()

    def ldflags(self) -> str:
        """The linker's -X flags that make the programs report this release (`v1.37.2`)."""
        major, minor = self.version.removeprefix("v").split(".")[:2]
        values = {"gitVersion": self.version, "gitMajor": major, "gitMinor": minor}
        return " ".join(f"-X {_VERSION_PACKAGE}.{name}={value}" for name, value in values.items())

    def etcd_version(self) -> str | None:
        """The etcd client version this release's module links ("v3.6.4"), which names its etcd."""
        found = dict(_ETCD_REQUIRE.findall((self.folder / "go.mod").read_text(encoding="utf-8")))
        return found.get("client")


@dataclass(frozen=True, order=True)
class Etcd:
    """etcd's server at one release, from the wrapper module judges/etcd-3.N."""

    version: str  # "v3.6.4"
    folder: Path

    def source_hash(self) -> str:
        return _source_hash(self.folder)

    def binary(self) -> Path:
        return cache_dir() / f"etcd-{self.version}-{self.source_hash()}" / ETCD_PROGRAM

    def built(self) -> bool:
        try:
            return self.binary().is_file()
        except OSError:
            return False


@dataclass(frozen=True)
class Containerd:
    """containerd, its runc shim and ctr at one release, from the module judges/containerd-2.N."""

    version: str  # "v2.4.2"
    folder: Path

    def source_hash(self) -> str:
        return _source_hash(self.folder)

    def binary(self, program: str) -> Path:
        return cache_dir() / f"containerd-{self.version}-{self.source_hash()}" / program

    def built(self) -> bool:
        try:
            return all(self.binary(program).is_file() for program in CONTAINERD_PROGRAMS)
        except OSError:
            return False


def _source_hash(*folders: Path) -> str:
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
                digest.update(str(path.relative_to(JUDGES)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _modules(pattern: str, require: re.Pattern[str], line: str) -> Iterator[tuple[re.Match[str], Path]]:
    """Each module folder under judges/ that `pattern` names, with `require`'s match in its go.mod;
    a go.mod without one is an error that names the `line` it lacks."""
    for gomod in JUDGES.glob(f"{pattern}/go.mod"):
        match = require.search(gomod.read_text(encoding="utf-8"))
        if match is None:
            raise RuntimeError(f"{gomod}: no '{line}' line")
        yield match, gomod.parent


def _version_key(version: str) -> tuple[int, ...]:
    """A "v3.6.4" version as numbers, so that v3.10 sorts after v3.9."""
    return tuple(int(n) for n in version[1:].split("."))


def releases() -> list[Release]:
    """Every release with a module under judges/, oldest first."""
    found = _modules("k8s-1.*", _REQUIRE, "require k8s.io/kubernetes v1.N.P")
    return sorted(Release(int(match.group(2)), match.group(1), folder) for match, folder in found)


def choose(names: list[str]) -> list[Release]:
    """The releases named ("upstream" is all of them; "upstream-1.37" one), oldest first."""
    known = releases()
    by_name = {r.name: r for r in known}
    chosen: set[Release] = set()
    for name in names:
        if name == "upstream":
            chosen.update(known)
        elif name in by_name:
            chosen.add(by_name[name])
        else:
            raise ValueError(f"unknown judge {name!r}; choose from upstream, {', '.join(by_name)}")
    return sorted(chosen)


def etcds() -> list[Etcd]:
    """Every etcd wrapper module under judges/ (etcd-3.N), oldest first."""
    found = []
    for gomod in JUDGES.glob("etcd-*/go.mod"):
        versions = dict(_ETCD_REQUIRE.findall(gomod.read_text(encoding="utf-8")))
        if "server" not in versions:
            raise RuntimeError(f"{gomod}: no 'require go.etcd.io/etcd/server/v3 v3.N.P' line")
        found.append(Etcd(versions["server"], gomod.parent))
    return sorted(found, key=lambda e: _version_key(e.version))


def etcd_for(release: Release) -> Etcd:
    """The etcd this release's kube-apiserver is built against (its go.mod's etcd client)."""
    wanted = release.etcd_version()
    for etcd in etcds():
        if etcd.version == wanted:
            return etcd
    raise JudgeUnavailable(f"no judges/etcd-* module builds etcd {wanted}, the one {release.name} links")


def containerds() -> list[Containerd]:
    """Every containerd module under judges/ (containerd-2.N), oldest first."""
    found = _modules("containerd-*", _CONTAINERD_REQUIRE, f"require {_CONTAINERD_MODULE} v2.N.P")
    return sorted(
        (Containerd(match.group(1), folder) for match, folder in found), key=lambda c: _version_key(c.version)
    )


def cache_dir() -> Path:
    base = os.environ.get("DEVSHIM_JUDGE_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "devshim" / "judges"


def requirements(chosen: list[Release]) -> str:
    """What running the judge at `chosen` needs, said before it starts."""
    unbuilt = [r for r in chosen if not r.built()]
    build = (
        f"builds {', '.join(r.name for r in unbuilt)} first (about {BUILD_MINUTES} minutes and "
        f"{BUILD_GIB:g} GiB of Go caches each, seconds once Go's caches hold them)"
        if unbuilt
        else "harnesses already built"
    )
    return f"the upstream judge runs as root, in private mount namespaces (unshare -m); {build}"


def check_can_run(chosen: list[Release]) -> None:
    """Raise JudgeUnavailable (one line) unless this machine can run the judge at `chosen`."""
    if os.geteuid() != 0:
        raise JudgeUnavailable(
            "the upstream judge needs root: the kubelet's device manager only uses "
            "/var/lib/kubelet/device-plugins, so each harness runs in a private mount namespace"
        )
    if shutil.which("unshare") is None:
        raise JudgeUnavailable("the upstream judge needs unshare(1) (util-linux) for its mount namespaces")
    if any(not r.built() for r in chosen) and shutil.which("go") is None:
        raise JudgeUnavailable(
            "the upstream judge builds its harness with Go (1.26 or newer) and 'go' is not on PATH; "
            "install Go, or prebuild elsewhere into DEVSHIM_JUDGE_CACHE"
        )


def build(release: Release, *, log: bool = True, program: str = HARNESS_PROGRAM) -> Path:
    """The release's `program` (by default the harness), built now unless the cache holds it."""
    if not release.carries(program):
        raise JudgeUnavailable(f"the {release.name} module carries no {program} program")
    what = "judge" if program == HARNESS_PROGRAM else program
    label = f"the {release.name} {what} ({release.version})"
    return _build(release.folder, f"./{program}", release.binary(program), label, release.ldflags(), log)


def build_dra_test_driver(release: Release, *, log: bool = True) -> Path:
    """upstream's own DRA test driver (test/e2e/dra/test-driver: a kubelet plugin on
    k8s.io/dynamic-resource-allocation's kubeletplugin helper, as vendors' drivers are), built
    from the release's module unless the cache holds it."""
    label = f"the {release.name} DRA test driver"
    target = release.binary(DRA_TEST_DRIVER_PROGRAM)
    return _build(release.folder, DRA_TEST_DRIVER_PACKAGE, target, label, release.ldflags(), log)


def build_etcd(etcd: Etcd, *, log: bool = True) -> Path:
    """etcd's server at `etcd.version`, built now unless the cache holds it."""
    return _build(etcd.folder, ".", etcd.binary(), f"etcd {etcd.version}", "", log)


def build_containerd(containerd: Containerd, *, log: bool = True) -> dict[str, Path]:
    """containerd's programs at `containerd.version`, by name, built now unless the cache holds
    them: static (no cgo, so no btrfs snapshotter, which the node does not use)."""
    ldflags = f"-X {_CONTAINERD_MODULE}/version.Version={containerd.version}"
    return {
        program: _build(containerd.folder, f"{_CONTAINERD_MODULE}/cmd/{program}", containerd.binary(program),
                        f"{program} {containerd.version}", ldflags, log, cgo=False)
        for program in CONTAINERD_PROGRAMS
    }  # fmt: skip


def _build(
    folder: Path, package: str, target: Path, label: str, ldflags: str, log: bool, *, cgo: bool = True
) -> Path:
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building the same release: wait for it
        if target.is_file():
            return target
        if log:
            sys.stderr.write(f"devshim compat: building {label}\n")
            sys.stderr.flush()
        partial = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent)) / target.name
        env = {**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=readonly -buildvcs=false"}
        if not cgo:
            env["CGO_ENABLED"] = "0"
        try:
            done = subprocess.run(
                ["go", "build", "-o", str(partial), f"-ldflags={ldflags}", package],
                cwd=folder, env=env, capture_output=True, text=True,
                timeout=BUILD_TIMEOUT_S, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
                raise JudgeUnavailable(f"building {label} failed: {' | '.join(tail)}")
            partial.rename(target)
        finally:
            shutil.rmtree(partial.parent, ignore_errors=True)
    return target

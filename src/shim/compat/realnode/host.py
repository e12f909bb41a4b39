"""The node's private corner of this machine: one mount namespace and one cgroup.

containerd, runc and the kubelet each use some fixed paths (/run/containerd, the kubelet's
device-plugins directory, /var/log/pods): the node's daemons run in a private mount namespace
where those paths are the node's own folders (or a tmpfs), so the host's are never touched and
every mount the runtime makes dies with the namespace. Every process of the node (the daemons,
containerd's shims, the containers, which the kubelet puts under the node's cgroup root) lives
in one cgroup tree: stopping the node kills that whole tree, waits until it is empty, and
removes it, so nothing is left running or mounted, whatever state a failed test left it in.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from shim.compat.plugin_process import make_mount_point, remove_mount_points

CGROUP_FS = Path("/sys/fs/cgroup")
# A namespace is held open by a process that only sleeps; every daemon joins it with nsenter.
_HOLD = 'set -e; for step in "$@"; do eval "$step"; done; echo ready; exec sleep infinity'
STOP_TIMEOUT_S = 30.0


class NodeUnavailable(RuntimeError):
    """This machine cannot run the node; the message says what is missing, in one line."""


def _cgroup_mounts() -> list[tuple[Path, str]]:
    """Every mounted cgroup hierarchy: (mount point, "cgroup2" or the v1 controllers)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if kind and kind[0] in ("cgroup", "cgroup2"):
            found.append((Path(fields[4]), "cgroup2" if kind[0] == "cgroup2" else kind[2]))
    return found


class NodeCgroup:
    """The node's cgroup root, in every hierarchy, and the leaf its daemons run in.

    The kubelet is given the root (cgroupRoot) and creates its pods' cgroups under it; the
    daemons run in root/daemons. One hierarchy (pids on cgroup v1, the unified one on v2) is
    where the node's processes are counted and killed.
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"devshim-node-{secrets.token_hex(4)}"
        mounts = _cgroup_mounts()
        unified = [m for m, kind in mounts if kind == "cgroup2" and m == CGROUP_FS]
        if unified:
            self.hierarchies, self.tracking = unified, unified[0]
        else:
            self.hierarchies = [m for m, kind in mounts if kind != "cgroup2"]
            pids = [m for m, kind in mounts if "pids" in kind.split(",")]
            if not pids:
                raise NodeUnavailable("the node needs the v1 pids hierarchy or cgroup v2 at /sys/fs/cgroup")
            self.tracking = pids[0]

    @property
    def path(self) -> str:
        """The cgroup root as the kubelet's cgroupRoot names it."""
        return f"/{self.name}"

    @property
    def daemons(self) -> Path:
        return self.tracking / self.name / "daemons"

    def create(self) -> None:
        for hierarchy in self.hierarchies:
            node = hierarchy / self.name
            try:
                node.mkdir()
            except OSError as err:
                raise NodeUnavailable(f"cannot create the node's cgroup {node}: {err.strerror}") from None
            for name in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset: a new cgroup starts with none
                if (node / name).exists() and not (node / name).read_text().strip():
                    (node / name).write_text((hierarchy / name).read_text())
            if hierarchy == self.tracking and (hierarchy / "cgroup.subtree_control").exists():
                wanted = set((hierarchy / "cgroup.controllers").read_text().split())
                for controller in sorted(wanted):
                    with contextlib.suppress(OSError):
                        (node / "cgroup.subtree_control").write_text(f"+{controller}")
        self.daemons.mkdir()

    def enter(self) -> None:
        """Move the calling process into the daemons' cgroup (run in a child before exec)."""
        (self.daemons / "cgroup.procs").write_text(str(os.getpid()))

    def pids(self) -> set[int]:
        found: set[int] = set()
        root = self.tracking / self.name
        for procs in root.rglob("cgroup.procs") if root.exists() else ():
            with contextlib.suppress(OSError):
                found.update(int(pid) for pid in procs.read_text().split())
        return found

    def kill_all(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGKILL every process of the node until none is left (children forked meanwhile too)."""
        deadline = time.monotonic() + timeout
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: processes {sorted(pids)} outlived SIGKILL ({timeout:g} s)")
            time.sleep(0.05)

    def remove(self) -> None:
        """Remove the cgroup tree in every hierarchy, deepest first (kill_all first)."""
        for hierarchy, _ in _cgroup_mounts():
            root = hierarchy / self.name
            if not root.is_dir():
                continue
            folders = [p for p in root.rglob("*") if p.is_dir()]
            for folder in (*sorted(folders, key=lambda p: len(p.parts), reverse=True), root):
                with contextlib.suppress(FileNotFoundError):
                    folder.rmdir()


class PrivateHost:
    """A mount namespace holding the node's binds and tmpfs, and the node's cgroup.

    `binds` maps a fixed path of the host to the node's own folder that replaces it inside;
    `tmpfs` paths get an empty tmpfs inside. Mount points missing on the host are created for
    the namespace to mount on, and removed again on stop when still empty.
    """

    def __init__(self, binds: Mapping[Path, Path], tmpfs: Sequence[Path]) -> None:
        self.binds, self.tmpfs = dict(binds), list(tmpfs)
        self.cgroup = NodeCgroup()
        self._holder: subprocess.Popen[bytes] | None = None
        self._created: list[Path] = []

    def start(self) -> None:
        for tool in ("unshare", "nsenter", "mount"):
            if shutil.which(tool) is None:
                raise NodeUnavailable(f"the node needs {tool}(8) (util-linux) for its mount namespace")
        self.cgroup.create()
        for point in (*self.binds, *self.tmpfs):
            self._created += make_mount_point(point)
        steps = [f'mount --bind "{source}" "{point}"' for point, source in self.binds.items()]
        steps += [f'mount -t tmpfs -o mode=0711 devshim-node "{point}"' for point in self.tmpfs]
        unshare = ["unshare", "--mount", "--propagation", "private", "--"]
        self._holder = subprocess.Popen(
            [*unshare, "sh", "-c", _HOLD, "devshim-node", *steps],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            preexec_fn=self.cgroup.enter,
        )  # fmt: skip
        assert self._holder.stdout is not None
        first = self._holder.stdout.readline().decode(errors="replace").strip()
        if first != "ready":
            rest = self._holder.stdout.read().decode(errors="replace").strip()
            self._holder.wait()
            raise NodeUnavailable(f"the node's mount namespace could not be made: {first} {rest}".strip())

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` made to run inside the namespace."""
        assert self._holder is not None, "start() first"
        return ["nsenter", f"--mount=/proc/{self._holder.pid}/ns/mnt", "--", *argv]

    def spawn(
        self, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """`argv` inside the namespace and the node's cgroup, its output appended to `log`."""
        with log.open("ab") as out:
            return subprocess.Popen(
                self.command(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None, preexec_fn=self.cgroup.enter,
            )  # fmt: skip

    def stop(self) -> None:
        """Kill everything the node runs, then remove its cgroup and the mount points made."""
        try:
            self.cgroup.kill_all()
        finally:
            if self._holder is not None:
                self._holder.wait()
                if self._holder.stdout is not None:
                    self._holder.stdout.close()
            self.cgroup.remove()
            remove_mount_points(self._created)
            self._created.clear()

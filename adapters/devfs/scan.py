"""Finding device nodes: globs, then sysfs attributes and NUMA node by major:minor.

sysfs is read the simple, documented way (README.md): for a node with
major:minor M:m, /sys/dev/{char,block}/M:m is resolved (on a real node it is a
link into /sys/devices) and it and up to four parents are searched for each
attribute, nearest first. Four levels reach a USB device's idVendor from its
tty (tty/ttyUSB0 -> ttyUSB0 -> 1-1:1.0 -> 1-1). A node that is not a device
(a regular file) has no sysfs attributes and no NUMA node.
"""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from .config import GroupConfig

SYSFS_PARENT_LEVELS = 4
MAX_ID_LENGTH = 63  # the kubelet's limit on a device ID


@dataclass(frozen=True, slots=True)
class Node:
    """One matched device node: its file name (the device ID's base), host path and NUMA node."""

    name: str
    path: str
    numa_node: int | None


def _sysfs_dir(path: str, sysfs_root: Path) -> Path | None:
    try:
        info = os.stat(path)
    except OSError:
        return None  # gone between the glob and the stat: the next scan drops it
    if stat.S_ISCHR(info.st_mode):
        kind = "char"
    elif stat.S_ISBLK(info.st_mode):
        kind = "block"
    else:
        return None
    return sysfs_root / "dev" / kind / f"{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def sysfs_attribute(directory: Path, name: str, sysfs_root: Path) -> str | None:
    """``name`` in ``directory`` or the nearest of its first four parents that has it."""
    current = directory.resolve()
    root = sysfs_root.resolve()
    for _ in range(SYSFS_PARENT_LEVELS + 1):
        value = _read(current / name)
        if value is not None:
            return value
        # Never wander above the sysfs root into the host's real files.
        if current == root or current.parent == current or root not in current.parents:
            return None
        current = current.parent
    return None


def numa_node(directory: Path) -> int | None:
    """device/numa_node when present and >= 0 (the kernel writes -1 for "no NUMA affinity")."""
    text = _read(directory / "device" / "numa_node")
    try:
        value = int(text) if text is not None else -1
    except ValueError:
        return None
    return value if value >= 0 else None


def _matches(directory: Path | None, wanted: dict[str, str], sysfs_root: Path) -> bool:
    if not wanted:
        return True
    if directory is None:
        return False
    return all(sysfs_attribute(directory, k, sysfs_root) == v for k, v in wanted.items())


def scan(group: GroupConfig, sysfs_root: Path) -> list[Node]:
    """The nodes ``group`` matches now, in glob order; a glob matching nothing adds none."""
    nodes: dict[str, Node] = {}
    seen_paths: set[str] = set()
    for pattern in group.paths:
        for path in sorted(glob.glob(pattern)):
            if path in seen_paths or os.path.isdir(path):
                continue
            seen_paths.add(path)
            name = os.path.basename(path)
            if len(name) > MAX_ID_LENGTH - 6 or any(c.isspace() or c == "," for c in name):
                logger.warning("{}: {} cannot name a device ID; skipped", group.resource, path)
                continue
            if name in nodes:
                # Two nodes of one name (say /dev/a/x and /dev/b/x) would share device IDs.
                logger.warning(
                    "{}: {} and {} share a name; skipped the second", group.resource, nodes[name].path, path
                )
                continue
            directory = _sysfs_dir(path, sysfs_root)
            if not _matches(directory, group.sysfs, sysfs_root):
                continue
            nodes[name] = Node(name, path, numa_node(directory) if directory is not None else None)
    return list(nodes.values())


def watched_directories(patterns: list[str]) -> tuple[set[Path], bool]:
    """The directories to watch for ``patterns`` (each one's part before its first wildcard),
    and whether some pattern has a wildcard in a directory part, which a watch there misses."""
    directories: set[Path] = set()
    deep = False
    for pattern in patterns:
        parts = Path(pattern).parts
        magic = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts) - 1)
        directories.add(Path(*parts[:magic]) if magic > 0 else Path("/"))
        deep = deep or magic < len(parts) - 1
    return directories, deep

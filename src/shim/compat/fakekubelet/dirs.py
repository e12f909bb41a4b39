"""How a starting kubelet cleans its device-plugins directory.

The cleanup is what a device plugin sees of a kubelet restart (its socket vanishes), and it
changed in Kubernetes 1.33, so the fake kubelet offers both behaviours. Both follow
pkg/kubelet/cm/devicemanager/manager.go CleanupPluginDirectory of the respective release.
"""

from __future__ import annotations

import os
import stat
from enum import StrEnum
from pathlib import Path

# manager.go checkpointFile(): the device manager's checkpoint survives every cleanup.
CHECKPOINT_FILE = "kubelet_internal_checkpoint"


class CleanupMode(StrEnum):
    """Which kubelet release's directory cleanup to perform on (re)start."""

    KUBELET_1_25 = "1.25"
    """1.25-1.32: remove every entry that is not a directory (os.Lstat; files, sockets, symlinks)."""

    KUBELET_1_33 = "1.33"
    """1.33+: remove only sockets (os.Stat, so a symlink to a socket counts as a socket)."""


def clean_plugin_dir(plugin_dir: Path, mode: CleanupMode) -> list[str]:
    """Remove what the chosen kubelet release removes; return the removed names, sorted."""
    removed = []
    for entry in sorted(os.listdir(plugin_dir)):
        path = plugin_dir / entry
        if entry == CHECKPOINT_FILE or not _is_removed(path, mode):
            continue
        # Upstream uses os.RemoveAll, which tolerates an entry vanishing under it.
        path.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _is_removed(path: Path, mode: CleanupMode) -> bool:
    try:
        # Upstream logs a failed stat and skips the entry (e.g. a dangling symlink under Stat).
        mode_bits = path.lstat().st_mode if mode is CleanupMode.KUBELET_1_25 else path.stat().st_mode
    except OSError:
        return False
    if stat.S_ISDIR(mode_bits):
        return False
    return mode is CleanupMode.KUBELET_1_25 or stat.S_ISSOCK(mode_bits)

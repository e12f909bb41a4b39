"""containerd with its CRI plugin, on the node's own root, state and socket.

The machine's containerd and runc (Debian's containerd 1.6 and runc serve here) run the node's
containers; only the configuration is the node's: its folders, the locally built sandbox image,
and no image is ever pulled. Two settings fit a machine without full root powers: oom_score_adj
is never lowered below containerd's own (lowering needs CAP_SYS_RESOURCE, which a VM's root may
lack: runc then fails every sandbox), and no CNI: the node's pods use the host network.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .host import NodeUnavailable
from .images import PAUSE_IMAGE

NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps pods and images in
BINARIES = ("containerd", "containerd-shim-runc-v2", "runc", "ctr")


def check_installed() -> None:
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        raise NodeUnavailable(
            f"the node needs containerd and runc on PATH (missing: {', '.join(missing)}; "
            "Debian: apt-get install containerd runc)"
        )


def _toml(value: object) -> str:
    """A TOML scalar or array (JSON's strings, numbers, booleans and arrays are valid TOML)."""
    return json.dumps(value)


def config(folder: Path) -> str:
    """containerd's configuration (format version 2, which containerd 1.6 and 1.7 read)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f"root = {_toml(str(folder / 'root'))}",
        f"state = {_toml(str(folder / 'state'))}",
        'disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",'
        ' "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]',
        "[grpc]",
        f"  address = {_toml(str(socket(folder)))}",
        "[ttrpc]",
        f"  address = {_toml(str(folder / 'containerd.sock.ttrpc'))}",
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {_toml(str(folder / 'opt'))}",
        f"[{cri}]",
        f"  sandbox_image = {_toml(PAUSE_IMAGE)}",
        "  restrict_oom_score_adj = true",
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        f"[{cri}.cni]",
        f"  bin_dir = {_toml(str(folder / 'cni-bin'))}",
        f"  conf_dir = {_toml(str(folder / 'cni-conf'))}",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
    ]
    return "\n".join(lines) + "\n"


def socket(folder: Path) -> Path:
    return folder / "containerd.sock"


def import_command(folder: Path, archive: Path) -> list[str]:
    """`ctr images import` of one OCI archive into the CRI plugin's namespace (unpacked for it)."""
    ctr = ["ctr", "--address", str(socket(folder)), "--namespace", NAMESPACE]
    return [*ctr, "images", "import", str(archive)]

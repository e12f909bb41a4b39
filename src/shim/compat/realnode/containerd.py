"""containerd with its CRI plugin, on the node's own root, state and socket.

By default the machine's containerd and runc (Debian's containerd 1.6 and runc serve here) run the
node's containers; a node that needs CDI (a connected node preparing DRA claims) runs containerd
2.x built from judges/containerd-2.N (`with_cdi()`; Debian bookworm's 1.6 has no CDI), with the
machine's runc. Only the configuration is the node's: its folders, the locally built sandbox
image, and no image is ever pulled. Two settings fit a machine without full root powers:
oom_score_adj is never lowered below containerd's own (lowering needs CAP_SYS_RESOURCE, which a
VM's root may lack: runc then fails every sandbox), and no CNI: the node's pods use the host
network.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shim.compat.upstream import releases as upstream

from .host import NodeUnavailable
from .images import PAUSE_IMAGE

NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps pods and images in
BINARIES = ("containerd", "containerd-shim-runc-v2", "runc", "ctr")


@dataclass(frozen=True)
class Runtime:
    """The containerd a node runs: its three programs (a name is looked up on PATH) and whether
    it resolves CDI devices (containerd 2.x always does; 1.6 cannot)."""

    containerd: str
    shim: str
    ctr: str
    version: str
    cdi: bool


# Debian's containerd 1.6 on PATH: finds its shim on PATH by the runtime type's name.
SYSTEM = Runtime("containerd", "containerd-shim-runc-v2", "ctr", "the machine's", cdi=False)


def with_cdi(*, log: bool = False) -> Runtime:
    """containerd 2.x from the newest judges/containerd-2.N module, built now unless cached."""
    found = upstream.containerds()
    if not found:
        raise upstream.JudgeUnavailable("no judges/containerd-2.N module: no containerd with CDI")
    built = upstream.build_containerd(found[-1], log=log)
    return Runtime(
        str(built["containerd"]), str(built["containerd-shim-runc-v2"]), str(built["ctr"]),
        found[-1].version, cdi=True,
    )  # fmt: skip


def check_installed(runtime: Runtime = SYSTEM) -> None:
    needed = BINARIES if runtime == SYSTEM else ("runc",)
    missing = [name for name in needed if shutil.which(name) is None]
    if missing:
        raise NodeUnavailable(
            f"the node needs containerd and runc on PATH (missing: {', '.join(missing)}; "
            "Debian: apt-get install containerd runc)"
        )


def _toml(value: object) -> str:
    """A TOML scalar or array (JSON's strings, numbers, booleans and arrays are valid TOML)."""
    return json.dumps(value)


def _daemon(folder: Path, version: int, unused_snapshotters: Sequence[str]) -> list[str]:
    """What both formats say of the daemon: its folders and sockets, and the snapshotters it
    must not load (only overlayfs is used)."""
    unused = [f"io.containerd.snapshotter.v1.{name}" for name in unused_snapshotters]
    return [
        f"version = {version}",
        f"root = {_toml(str(folder / 'root'))}",
        f"state = {_toml(str(folder / 'state'))}",
        f"disabled_plugins = {_toml(unused)}",
        "[grpc]",
        f"  address = {_toml(str(socket(folder)))}",
        "[ttrpc]",
        f"  address = {_toml(str(folder / 'containerd.sock.ttrpc'))}",
        '[plugins."io.containerd.internal.v1.opt"]',
        f"  path = {_toml(str(folder / 'opt'))}",
    ]


def config(folder: Path, runtime: Runtime = SYSTEM, cdi_dirs: Sequence[Path] = ()) -> str:
    """containerd's configuration for `runtime`: format 3 for containerd 2.x, whose CRI plugin
    reads CDI specs from `cdi_dirs` (only); format 2 (which 1.6 and 1.7 read) for the machine's."""
    if runtime.cdi:
        return _config_v3(folder, runtime, cdi_dirs)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        *_daemon(folder, 2, ("aufs", "btrfs", "zfs", "devmapper")),
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


def _config_v3(folder: Path, runtime: Runtime, cdi_dirs: Sequence[Path]) -> str:
    """Format 3 (containerd 2.0 on; 2.4 migrates it to its format 4 when it loads it). The CRI
    plugin is three: `io.containerd.grpc.v1.cri` (the CRI server: streaming), `cri.v1.images`
    (snapshotter, the pinned sandbox image) and `cri.v1.runtime` (runtimes, CNI, CDI). From 2.0
    CDI is always on (`enable_cdi` is gone); `cdi_spec_dirs` replaces its default of /etc/cdi
    and /var/run/cdi, so the node sees only its own specs. The runc runtime names the shim built
    with containerd (`runtime_path`), so no containerd-shim-runc-v2 on PATH is needed."""
    images, runtimes = 'plugins."io.containerd.cri.v1.images"', 'plugins."io.containerd.cri.v1.runtime"'
    snapshotters = ("blockfile", "btrfs", "devmapper", "erofs", "zfs")  # only overlayfs is used
    lines = [
        *_daemon(folder, 3, snapshotters),
        '[plugins."io.containerd.grpc.v1.cri"]',
        '  stream_server_address = "127.0.0.1"',
        '  stream_server_port = "0"',
        f"[{images}]",
        '  snapshotter = "overlayfs"',
        f"[{images}.pinned_images]",
        f"  sandbox = {_toml(PAUSE_IMAGE)}",
        f"[{runtimes}]",
        "  restrict_oom_score_adj = true",
        f"  cdi_spec_dirs = {_toml([str(d) for d in cdi_dirs])}",
        f"[{runtimes}.cni]",
        f"  bin_dirs = {_toml([str(folder / 'cni-bin')])}",
        f"  conf_dir = {_toml(str(folder / 'cni-conf'))}",
        f"[{runtimes}.containerd]",
        '  default_runtime_name = "runc"',
        f"[{runtimes}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"  runtime_path = {_toml(runtime.shim)}",
        '  sandboxer = "podsandbox"',
    ]
    return "\n".join(lines) + "\n"


def socket(folder: Path) -> Path:
    return folder / "containerd.sock"


def import_command(folder: Path, archive: Path, runtime: Runtime = SYSTEM) -> list[str]:
    """`ctr images import` of one OCI archive into the CRI plugin's namespace (unpacked for it)."""
    ctr = [runtime.ctr, "--address", str(socket(folder)), "--namespace", NAMESPACE]
    return [*ctr, "images", "import", str(archive)]

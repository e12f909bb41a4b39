"""`python -m shim.compat.node`: start a real node by hand, print where to meet it, stop on Ctrl-C.

sudo python -m shim.compat.node --release 1.37 --dir /tmp/node
# another shell: devshim run with device_plugins_dir /tmp/node/device-plugins, then
cp pod.json /tmp/node/manifests/   # a static pod; its status: curl <read-only API>/pods
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
from pathlib import Path

from shim.compat.upstream import releases as upstream

from .host import NodeUnavailable
from .kubelet import kubelet_releases
from .node import Node, NodeError


def main(argv: list[str] | None = None) -> int:
    carried = kubelet_releases()
    parser = argparse.ArgumentParser(prog="python -m shim.compat.node", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--release", choices=[f"1.{r.minor}" for r in carried], default=f"1.{carried[-1].minor}",
        help="the kubelet release (default: the newest carried)",
    )  # fmt: skip
    parser.add_argument("--dir", type=Path, help="the node's folder (default: a new one under /tmp)")
    args = parser.parse_args(argv)
    release = next(r for r in carried if f"1.{r.minor}" == args.release)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="devshim-node-"))
    try:
        binary = upstream.build(release, program=upstream.KUBELET_PROGRAM)
        with Node(folder, binary, release.minor) as node:
            print(f"node up in {node.started_in_s:.1f} s: kubelet {release.version}, folder {folder}")
            print(f"  device plugins:    {node.device_plugins_dir}")
            print(f"  plugins registry:  {node.plugins_registry_dir}")
            print(f"  PodResources:      {node.pod_resources_socket}")
            print(f"  static pods:       {node.manifests}")
            print(f"  read-only API:     http://127.0.0.1:{node.read_only_port}/pods")
            print(f"  logs:              {node.kubelet_log}, {node.containerd_log}, {node.pod_logs}")
            print("Ctrl-C stops it and removes what it ran and mounted.", flush=True)
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    except (NodeUnavailable, NodeError, upstream.JudgeUnavailable) as err:
        print(f"python -m shim.compat.node: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

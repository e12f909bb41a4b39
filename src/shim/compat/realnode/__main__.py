"""`python -m shim.compat.realnode`: start a real node by hand, print where to meet it, stop on Ctrl-C.

sudo python -m shim.compat.realnode --release 1.37 --dir /tmp/node
# another shell: devshim run with device_plugins_dir /tmp/node/device-plugins, then
cp pod.json /tmp/node/manifests/   # a static pod; its status: curl <read-only API>/pods

python -m shim.compat.realnode --control-plane --release 1.33 --dir /tmp/cp   # etcd and kube-apiserver
kubectl --kubeconfig /tmp/cp/admin.kubeconfig get --raw /apis/resource.k8s.io

python -m shim.compat.realnode --connected --dir /tmp/dra   # both, kube-scheduler, and a node with CDI
kubectl --kubeconfig /tmp/dra/control-plane/admin.kubeconfig get nodes
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from pathlib import Path

from shim.compat.upstream import releases as upstream

from .connected import ConnectedNode, connected_releases
from .controlplane import ControlPlane, apiserver_releases
from .host import NodeUnavailable
from .kubelet import kubelet_releases
from .node import Node, NodeError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shim.compat.realnode", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--release", help="the release (default: the newest carried)")
    parser.add_argument("--dir", type=Path, help="the node's folder (default: a new one under /tmp)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--control-plane", action="store_true", help="start etcd and kube-apiserver instead of a node"
    )
    mode.add_argument(
        "--connected", action="store_true",
        help="start etcd, kube-apiserver, kube-scheduler and a node registered with them (DRA, CDI)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    # Before anything starts, so a stop that comes as the "up" lines are read is not lost. SIGINT
    # too: started from a script's background job (`cmd &`), Python inherits it ignored and
    # installs no handler, so Ctrl-C or kill -INT would never stop the node.
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.default_int_handler)
    try:
        return _start(args, parser)
    except KeyboardInterrupt:  # stopped: what was started is stopped by its ``with``
        return 0


def _start(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.connected:
        carried = connected_releases()
    else:
        carried = apiserver_releases() if args.control_plane else kubelet_releases()
    names = [f"1.{r.minor}" for r in carried]
    if args.release is not None and args.release not in names:
        parser.error(f"--release: choose from {', '.join(names)}")
    release = carried[names.index(args.release)] if args.release else carried[-1]
    folder = args.dir or Path(tempfile.mkdtemp(prefix="devshim-node-"))
    if args.control_plane:
        return _control_plane(release, folder)
    if args.connected:
        return _connected(release, folder)
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
            _serve_until_stopped()
    except (NodeUnavailable, NodeError, upstream.JudgeUnavailable) as err:
        print(f"python -m shim.compat.realnode: {err}", file=sys.stderr)
        return 2
    return 0


def _serve_until_stopped() -> None:
    """Wait for Ctrl-C, SIGINT or SIGTERM (KeyboardInterrupt, main's handlers): the caller's
    ``with`` stops everything on the way out, and main returns 0."""
    while True:
        signal.pause()


def _control_plane(release: upstream.Release, folder: Path) -> int:
    try:
        with ControlPlane(release.minor, folder, log=True) as plane:
            took = plane.etcd_started_in_s + plane.apiserver_started_in_s
            versions = f"kube-apiserver {release.version}, etcd {plane.etcd.version}"
            print(f"control plane up in {took:.1f} s: {versions}, folder {folder}")
            print(f"  API server:        {plane.url}")
            print(f"  admin kubeconfig:  {plane.admin_kubeconfig}")
            print(f"  CA:                {plane.ca_file}")
            print(f"  logs:              {plane.apiserver_log}, {plane.etcd_log}")
            print("Ctrl-C stops both.", flush=True)
            _serve_until_stopped()
    except (NodeError, upstream.JudgeUnavailable, OSError) as err:
        print(f"python -m shim.compat.realnode: {err}", file=sys.stderr)
        return 2
    return 0


def _connected(release: upstream.Release, folder: Path) -> int:
    try:
        with ConnectedNode(release.minor, folder, log=True) as cluster:
            node, plane = cluster.node, cluster.plane
            print(f"connected node up in {cluster.started_in_s:.1f} s: {release.version}, "
                  f"containerd {node.runtime.version}, folder {folder}")  # fmt: skip
            print(f"  API server:        {plane.url}")
            print(f"  admin kubeconfig:  {plane.admin_kubeconfig}")
            print(f"  node:              {cluster.node_name} (kubelet kubeconfig {cluster.node_kubeconfig})")
            print(f"  plugins registry:  {node.plugins_registry_dir}")
            print(f"  DRA plugins:       {node.plugins_dir}")
            print(f"  CDI specs:         {node.cdi_dir}")
            print(f"  device plugins:    {node.device_plugins_dir}")
            print(f"  logs:              {node.kubelet_log}, {node.containerd_log}, {node.pod_logs},")
            assert cluster.scheduler is not None
            print(f"                     {cluster.scheduler.log}, {plane.apiserver_log}, {plane.etcd_log}")
            print("Ctrl-C stops everything and removes what the node ran and mounted.", flush=True)
            _serve_until_stopped()
    except (NodeUnavailable, NodeError, upstream.JudgeUnavailable, OSError) as err:
        print(f"python -m shim.compat.realnode: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

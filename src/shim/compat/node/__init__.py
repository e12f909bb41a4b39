"""A real node for tests and by hand: containerd and the upstream kubelet, running pods.

The upstream judge (shim.compat.upstream) runs the kubelet's device manager alone; the node runs
the whole kubelet of a release, standalone, with containerd and runc running its static pods, so
a pod's container shows what a device plugin's grant became. images.py builds the images from a
static busybox; host.py keeps the node's mounts and processes private and removable;
containerd.py and kubelet.py configure the two daemons; node.py runs them. docs/real-node.md.
"""

from .host import NodeUnavailable
from .node import Node, NodeError, Pod, pod_manifest

__all__ = ["Node", "NodeError", "NodeUnavailable", "Pod", "pod_manifest"]

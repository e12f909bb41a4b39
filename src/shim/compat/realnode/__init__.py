"""A real node for tests and by hand: containerd and the upstream kubelet, running pods; and a
control plane beside it: etcd and the upstream kube-apiserver.

The upstream judge (shim.compat.upstream) runs the kubelet's device manager alone; the node runs
the whole kubelet of a release, standalone, with containerd and runc running its static pods, so
a pod's container shows what a device plugin's grant became. images.py builds the images from a
static busybox; host.py keeps the node's mounts and processes private and removable;
containerd.py and kubelet.py configure the two daemons; node.py runs them. controlplane.py runs
etcd and a release's kube-apiserver (apiserver.py: their command lines and a client; certs.py:
their certificates). connected.py runs both with kube-scheduler (scheduler.py), the kubelet
registered with the API server and containerd 2.x with CDI: DRA end to end. docs/real-node.md.
"""

from .apiserver import APIError
from .connected import ConnectedNode
from .controlplane import ControlPlane, ControlPlaneError
from .host import NodeUnavailable
from .node import Node, NodeError, Pod, pod_manifest

__all__ = [
    "APIError",
    "ConnectedNode",
    "ControlPlane",
    "ControlPlaneError",
    "Node",
    "NodeError",
    "NodeUnavailable",
    "Pod",
    "pod_manifest",
]

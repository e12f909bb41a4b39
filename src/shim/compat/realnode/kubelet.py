"""The upstream kubelet: standalone (static pods from a folder, no API server), or connected
(given a kubeconfig: it registers its Node and runs the pods the scheduler binds to it, static
pods too).

The binary is the release's own cmd/kubelet (judges/k8s-1.NN/kubelet, built and cached like the
device-manager harness). Its configuration fits a test machine: the cgroupfs driver under the
node's cgroup root, swap and cgroup v1 allowed, node allocatable not enforced, no eviction or
image garbage collection to fight the tests, and every folder it writes (root dir, certificates,
volume plugins) inside the node's folder. Its read-only port serves /pods, where a static pod's
status is the kubelet's own.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from shim.compat.upstream import releases as upstream

NODE_NAME = "devshim-node"
HTTP_TIMEOUT_S = 5.0
# Read-only API answers are small (a few pods); a bound all the same.
RESPONSE_LIMIT = 16 * 1024 * 1024


def kubelet_releases() -> list[upstream.Release]:
    """The releases whose module carries the whole kubelet, oldest first."""
    return [r for r in upstream.releases() if r.carries(upstream.KUBELET_PROGRAM)]


def config(
    minor: int, folder: Path, *, cgroup_root: str, runtime_socket: Path, port: int, read_only_port: int
) -> dict[str, Any]:
    """A KubeletConfiguration (kubelet.config.k8s.io/v1beta1) for release 1.`minor`."""
    conf: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        "staticPodPath": str(folder / "manifests"),
        "fileCheckFrequency": "1s",
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "volumePluginDir": str(folder / "volume-plugins"),
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": read_only_port,
        "healthzPort": 0,
        "enforceNodeAllocatable": ["none"],
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
    }
    if minor >= 31:
        # 1.31 added the switch (cgroup v1 in maintenance); later releases refuse v1 unless told.
        conf["failCgroupV1"] = False
        # Alpha in 1.31: a container's devices' health in its pod status (KEP-4680).
        conf["featureGates"] = {"ResourceHealthStatus": True}
    return conf


def command(binary: Path, folder: Path, kubeconfig: Path | None = None) -> list[str]:
    """The kubelet's command line; with `kubeconfig`, connected (its --kubeconfig: "Providing
    --kubeconfig enables API server mode"; the Node is registered under NODE_NAME)."""
    argv = [
        str(binary),
        f"--config={folder / 'kubelet.json'}",
        f"--root-dir={folder / 'root'}",
        f"--cert-dir={folder / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        "--v=2",
    ]
    if kubeconfig is not None:
        argv.append(f"--kubeconfig={kubeconfig}")
    return argv


def read_only_get(port: int, path: str) -> Any:
    """A JSON document from the kubelet's read-only API."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=HTTP_TIMEOUT_S) as response:
        return json.loads(response.read(RESPONSE_LIMIT))


def pod_name(name: str) -> str:
    """The name the kubelet gives a static pod: its manifest's name and the node's."""
    return f"{name}-{NODE_NAME}"

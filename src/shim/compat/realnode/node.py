"""One real node: containerd and the upstream kubelet of one release, inside one folder.

    with Node(folder, kubelet_binary, minor=37) as node:
        node.run_pod(pod_manifest("gpu", "env; sleep infinity", {"example.com/gpu": 1}))
        node.wait_for_pod("gpu", running)

The kubelet is standalone (static pods from folder/manifests), or connected when given a
`kubeconfig` (connected.py starts it beside a control plane and kube-scheduler); a device plugin
meets it at `device_plugins_dir`, a watcher plugin at `plugins_registry_dir`, a DRA driver's
socket goes under `plugins_dir`, a PodResources client at `pod_resources_socket`. With a
`runtime` that resolves CDI (containerd.with_cdi()), containerd reads CDI specs from `cdi_dir`
only. Pods use the host network, so no CNI is needed. Everything it starts
is stopped on exit, whatever happened (host.PrivateHost). docs/real-node.md has the folder's
layout and how to start one by hand (python -m shim.compat.realnode).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shim.compat.tails import log_tail
from shim.facts import KUBELET_SOCKET
from shim.node import sockets

from . import containerd, images, kubelet
from .daemon import Started
from .host import NodeUnavailable, PrivateHost

# The paths the kubelet and containerd hard-code, replaced inside the node's namespace.
KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
POD_LOGS = Path("/var/log/pods")
CONTAINER_LOGS = Path("/var/log/containers")
CONTAINERD_RUN = Path("/run/containerd")  # runc's state and the shims' sockets
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
LOG_TAIL = 2000

Pod = dict[str, Any]


class NodeError(RuntimeError):
    """The node did not reach a state in time; the message says which, and what it saw last."""


def pod_manifest(
    name: str, script: str, limits: Mapping[str, int] | None = None, *, restart: str = "Never"
) -> Pod:
    """A static pod of one container running `script` with /bin/sh in the node's test image."""
    container: dict[str, Any] = {
        "name": "main",
        "image": images.TEST_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", script],
    }
    if limits:
        container["resources"] = {"limits": {key: str(value) for key, value in limits.items()}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "hostNetwork": True,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


def free_port() -> int:
    """A local TCP port free at the time of asking."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path) -> str:
    return log_tail(path, LOG_TAIL)


class Node(Started):
    """containerd and the kubelet of release 1.`minor` (its binary: `kubelet_binary`) in `folder`;
    the kubelet connected to an API server by `kubeconfig`, containerd the machine's or `runtime`."""

    def __init__(
        self, folder: Path, kubelet_binary: Path, minor: int, *, kubeconfig: Path | None = None,
        runtime: containerd.Runtime = containerd.SYSTEM,
    ) -> None:  # fmt: skip
        self.folder, self.kubelet_binary, self.minor = folder, kubelet_binary, minor
        self.kubeconfig, self.runtime = kubeconfig, runtime
        self.device_plugins_dir = folder / "device-plugins"
        self.manifests = folder / "manifests"
        self.kubelet_root = folder / "root"
        self.plugins_registry_dir = self.kubelet_root / "plugins_registry"
        # <root-dir>/plugins: where a kubelet's plugins (CSI, DRA) keep their sockets by custom
        self.plugins_dir = self.kubelet_root / "plugins"
        self.cdi_dir = folder / "cdi"  # containerd's only CDI spec directory (runtime.cdi)
        self.pod_resources_socket = self.kubelet_root / "pod-resources" / KUBELET_SOCKET
        self.checkpoint = self.device_plugins_dir / "kubelet_internal_checkpoint"
        self.pod_logs = folder / "logs" / "pods"
        self.kubelet_log = folder / "kubelet.log"
        self.containerd_log = folder / "containerd.log"
        self.read_only_port = 0
        self._containerd_dir = folder / "containerd"
        self._host = PrivateHost(
            binds={
                KUBELET_DEVICE_PLUGINS: self.device_plugins_dir,
                POD_LOGS: self.pod_logs,
                CONTAINER_LOGS: folder / "logs" / "containers",
            },
            tmpfs=[CONTAINERD_RUN],
        )
        self._containerd: subprocess.Popen[bytes] | None = None
        self._kubelet: subprocess.Popen[bytes] | None = None
        self.started_in_s = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def _start(self) -> None:
        began = time.monotonic()
        if os.geteuid() != 0:
            raise NodeUnavailable("the node runs containers and a kubelet: it needs root")
        containerd.check_installed(self.runtime)
        try:
            busybox = images.static_busybox()
        except images.ImageError as err:
            raise NodeUnavailable(str(err)) from None
        own = (self.device_plugins_dir, self.manifests, self.kubelet_root, self.plugins_dir, self.cdi_dir,
               self.pod_logs)  # fmt: skip
        for path in (*own, self.folder / "logs" / "containers", self._containerd_dir, self.folder / "images"):
            path.mkdir(parents=True, exist_ok=True)
        self._host.start()
        config = self._containerd_dir / "config.toml"
        cdi_dirs = [self.cdi_dir] if self.runtime.cdi else []
        config.write_text(containerd.config(self._containerd_dir, self.runtime, cdi_dirs))
        self._containerd = self._host.spawn([self.runtime.containerd, "--config", str(config)],
                                            self.containerd_log)  # fmt: skip
        self._wait(lambda: sockets.answers(containerd.socket(self._containerd_dir)), "containerd serving",
                   self.containerd_log)  # fmt: skip
        for image in images.IMAGES:
            archive = self.folder / "images" / f"{image.name.replace('/', '_').replace(':', '_')}.tar"
            images.write_archive(image, busybox, archive)
            self.import_image(archive)
        self.read_only_port = free_port()
        conf = kubelet.config(
            self.minor, self.folder, cgroup_root=self._host.cgroup.path,
            runtime_socket=containerd.socket(self._containerd_dir), port=free_port(),
            read_only_port=self.read_only_port,
        )  # fmt: skip
        (self.folder / "kubelet.json").write_text(json.dumps(conf, indent=2))
        self.start_kubelet()
        self.started_in_s = time.monotonic() - began

    def import_image(self, archive: Path) -> None:
        """Import an OCI layout tar (images.write_layout) into the CRI's image store."""
        argv = self._host.command(containerd.import_command(self._containerd_dir, archive, self.runtime))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise NodeError(f"importing {archive.name} failed: {(done.stderr or done.stdout).strip()}")

    def start_kubelet(self) -> None:
        """Start the kubelet and wait until it serves device plugins and its read-only API."""
        socket_path = self.device_plugins_dir / KUBELET_SOCKET
        socket_path.unlink(missing_ok=True)  # a stopped kubelet's: ready means the new one's
        argv = kubelet.command(self.kubelet_binary, self.folder, self.kubeconfig)
        self._kubelet = self._host.spawn(argv, self.kubelet_log)

        def ready() -> bool:
            return sockets.answers(socket_path) and self._answers()

        self._wait(ready, f"the kubelet ({self.minor}) serving", self.kubelet_log)

    def stop_kubelet(self) -> None:
        """SIGTERM the kubelet, SIGKILL after STOP_GRACE_S; its pods keep running."""
        if self._kubelet is not None and self._kubelet.poll() is None:
            self._kubelet.send_signal(signal.SIGTERM)
            try:
                self._kubelet.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self._kubelet.kill()
                self._kubelet.wait()
        self._kubelet = None

    def restart_kubelet(self) -> None:
        self.stop_kubelet()
        self.start_kubelet()

    def stop(self) -> None:
        """Kill everything the node runs; nothing is left running or mounted."""
        try:
            self.stop_kubelet()
        finally:
            self._host.stop()
            for process in (self._containerd, self._kubelet):
                if process is not None:
                    process.wait()

    # -- pods --------------------------------------------------------------------------------

    def run_pod(self, manifest: Pod) -> str:
        """Hand the kubelet a static pod (written whole, then renamed into its folder); its name."""
        name = str(manifest["metadata"]["name"])
        partial = self.folder / f".{name}.{secrets.token_hex(4)}.json"
        partial.write_text(json.dumps(manifest))
        partial.rename(self.manifests / f"{name}.json")
        return name

    def remove_pod(self, name: str) -> None:
        (self.manifests / f"{name}.json").unlink()

    def pods(self) -> dict[str, Pod]:
        """The kubelet's pods by manifest name, status included (its read-only /pods)."""
        listed = kubelet.read_only_get(self.read_only_port, "/pods").get("items") or []
        suffix = f"-{kubelet.NODE_NAME}"
        return {str(p["metadata"]["name"]).removesuffix(suffix): p for p in listed}

    def wait_for_pod(self, name: str, check: Callable[[Pod], bool], what: str, timeout: float = 60.0) -> Pod:
        """The pod once `check` holds for it; NodeError naming `what` and its last status if not."""
        seen: list[Pod] = []

        def holds() -> bool:
            try:
                pod = self.pods().get(name)
            except (OSError, urllib.error.URLError, ValueError):
                return False
            if pod is None:
                return False
            seen[:] = [pod]
            return check(pod)

        last = lambda: json.dumps(seen[0].get("status") if seen else None)[:LOG_TAIL]  # noqa: E731
        self._wait(holds, f"pod {name}: {what}", self.kubelet_log, timeout=timeout, detail=last)
        return seen[0]

    def container_log(self, name: str, container: str = "main", *, static: bool = True) -> str:
        """What the pod's container wrote (the CRI log's lines, their timestamps and streams cut):
        a static pod's by its manifest's name, else (a pod from the API server) by its own."""
        lines = []
        pod = kubelet.pod_name(name) if static else name
        for path in sorted(self.pod_logs.glob(f"default_{pod}_*/{container}/*.log")):
            for line in path.read_text(errors="replace").splitlines():
                lines.append(line.split(" ", 3)[3] if line.count(" ") >= 3 else line)
        return "\n".join(lines)

    # -- waiting -----------------------------------------------------------------------------

    def _wait(
        self, check: Callable[[], bool], what: str, log: Path, timeout: float = START_TIMEOUT_S,
        detail: Callable[[], str] | None = None,
    ) -> None:  # fmt: skip
        deadline = time.monotonic() + timeout
        while not check():
            for process, name in ((self._containerd, "containerd"), (self._kubelet, "the kubelet")):
                if process is not None and process.poll() is not None:
                    raise NodeError(f"{name} exited ({process.returncode}) waiting for {what}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                seen = f"; last seen: {detail()}" if detail else ""
                raise NodeError(f"no {what} within {timeout:g} s{seen}\n{_tail(log)}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            kubelet.read_only_get(self.read_only_port, "/pods")
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return True

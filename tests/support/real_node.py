"""The real node (shim.compat.realnode) in tests: which kubelet releases run, devshim as a process in
front of it, what the kubelet reports, and what a pod's container saw.

The tests are synchronous: the node, devshim and its drivers are other processes, and waiting is
polling them for a condition under a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from shim.compat.fakekubelet.podresources import PodResourcesReader
from shim.compat.fakekubelet.records import AssignedDevice, RunningPod
from shim.compat.realnode import Node, NodeUnavailable, images
from shim.compat.realnode.connected import ConnectedNode, connected_releases
from shim.compat.realnode.kubelet import kubelet_releases
from shim.compat.realnode.node import free_port
from tests.support.toolchains import toolchain, unavailable
from tests.support.unix import short_temp_dir

KUBELETS = kubelet_releases()
DEFAULT = (KUBELETS[-1],)  # the newest; --full-matrix adds the others
# The end of every test pod's report (see report()): the container wrote everything before it.
END = "END-OF-REPORT"
T = TypeVar("T")


def check_machine(*, connected: bool = False) -> None:
    """Skip (or, under CI, fail) where this machine lacks what the node needs, saying what; a
    `connected` node builds its containerd (judges/containerd-2.N) and needs only runc, and
    openssl for the control plane's certificates."""
    if os.geteuid() != 0:
        unavailable("the real node needs root: it runs containerd, runc and a kubelet")
    runtime = ("runc",) if connected else ("containerd", "containerd-shim-runc-v2", "runc", "ctr")
    missing = [t for t in (*runtime, "unshare", "nsenter") if shutil.which(t) is None]
    if missing:
        unavailable(f"the real node needs {', '.join(missing)} (Debian: containerd runc util-linux)")
    toolchain("go", "the real node's kubelet (src/shim/compat/upstream/judges/k8s-1.NN/kubelet)")
    if connected:
        toolchain("openssl", "the control plane's certificates (shim.compat.realnode.certs)")
    try:
        images.static_busybox()
    except images.ImageError as err:
        unavailable(f"the real node builds its images from a static busybox: {err}")


def wait_until(check: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """The first truthy value of `check()`; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def connected_node(prefix: str) -> Iterator[ConnectedNode]:
    """The newest connected release (API server, scheduler, kubelet, containerd with CDI) in a
    temp folder named by `prefix`, taking its turn among the real nodes, stopped afterwards;
    skipped (a failure under CI) where this machine cannot run it."""
    check_machine(connected=True)
    releases = connected_releases()
    if not releases:
        unavailable("no judges/k8s-1.NN module carries kube-apiserver, kube-scheduler and the kubelet")
    with one_node_at_a_time(), short_temp_dir(prefix) as folder:
        cluster = ConnectedNode(releases[-1].minor, folder)
        try:
            try:
                cluster.start()
            except NodeUnavailable as missing:  # what check_machine cannot see: cgroups, namespaces
                unavailable(str(missing))
            yield cluster
        finally:
            cluster.stop()


@contextlib.contextmanager
def one_node_at_a_time() -> Iterator[None]:
    """Two real nodes (a kubelet and a containerd each) on one machine at once trip over each other:
    with test_real_node.py's node beside it, the connected node's pods once waited in vain for a
    claim's preparation, or for a container's report. The xdist workers take turns, through a
    lock file."""
    with (Path(tempfile.gettempdir()) / "devshim-real-node.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Devshim:
    """`devshim run` in front of `node`, configured by `settings` (the node's folders added)."""

    def __init__(self, node: Node, settings: Mapping[str, Any]) -> None:
        self.node, self.port = node, free_port()
        folder = node.folder / "devshim"
        folder.mkdir(exist_ok=True)
        self.config, self.log = folder / "devshim.json", folder / "devshim.log"
        full = {
            "device_plugins_dir": str(node.device_plugins_dir),
            "plugins_registry_dir": str(node.plugins_registry_dir),
            "state_dir": str(folder / "state"),
            "http": {"host": "127.0.0.1", "port": self.port},
            "deallocation": {"pod_resources_socket": str(node.pod_resources_socket)},
            **settings,
        }
        self.config.write_text(json.dumps(full, indent=2))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Devshim:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "shim", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                # tests/conftest.py sets DEVSHIM_HTTP__PORT=0, which would win over the file's port
                env={**os.environ, "DEVSHIM_HTTP__PORT": str(self.port)},
            )  # fmt: skip
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> Devshim:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.stop()
        if kind is not None and self.log.exists():  # what devshim said is the next thing to read
            tail = self.log.read_text(errors="replace")[-6000:]
            sys.stderr.write(f"--- devshim's log ({self.log}), the end:\n{tail}\n")

    def status(self) -> dict[str, Any] | None:
        """devshim's /status, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=5) as response:
                return dict(json.load(response))
        except (OSError, ValueError):
            return None

    def registered(self, resource: str, timeout: float = 60.0) -> dict[str, Any]:
        """The resource's /status entry once devshim says the kubelet took its registration."""

        def entry() -> dict[str, Any] | None:
            assert self.process is not None and self.process.poll() is None, (
                f"devshim exited:\n{self.output()}"
            )
            found = ((self.status() or {}).get("resources") or {}).get(resource)
            return found if found and found.get("registered") else None

        return wait_until(entry, f"devshim registered {resource}", timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def kubelet_allocatable(node: Node) -> tuple[AssignedDevice, ...]:
    """The devices the kubelet's own PodResources API says can be allocated (healthy ones)."""

    async def call() -> tuple[AssignedDevice, ...]:
        async with PodResourcesReader(node.pod_resources_socket) as reader:
            return await reader.allocatable()

    return asyncio.run(call())


def kubelet_pods(node: Node) -> list[RunningPod]:
    """The pods and the devices their containers hold, as the kubelet's PodResources API lists them."""

    async def call() -> list[RunningPod]:
        async with PodResourcesReader(node.pod_resources_socket) as reader:
            return await reader.list()

    return asyncio.run(call())


def allocatable_ids(node: Node, resource: str) -> set[str]:
    return {d.id for d in kubelet_allocatable(node) if d.resource == resource}


def running(pod: dict[str, Any]) -> bool:
    return bool(pod["status"].get("phase") == "Running")


def report(node: Node, pod: str, timeout: float = 60.0) -> dict[str, str]:
    """The KEY=value lines a test pod's container wrote before END."""

    def finished() -> str | None:
        return text if END in (text := node.container_log(pod)) else None

    log = wait_until(finished, f"{pod} reported", timeout)
    found = {}
    for line in log.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key] = value
    return found


def reporting(*lines: str) -> str:
    """A container script: each line echoed as KEY=value from the container, then END, then sleep."""
    return "; ".join([*lines, f"echo {END}", "exec sleep infinity"])

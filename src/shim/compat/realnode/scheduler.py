"""The upstream kube-scheduler of a release, beside a control plane: it places the connected
node's pods and allocates their ResourceClaims (DRA) from the published ResourceSlices.

The binary is the release's own cmd/kube-scheduler (judges/k8s-1.NN/kube-scheduler, built and
cached like the kubelet). It is configured by a KubeSchedulerConfiguration file
(kubescheduler.config.k8s.io/v1: the kubeconfig in `clientConnection`, no leader election: there
is one scheduler) rather than the deprecated --kubeconfig flag, and serves its health endpoints
on 127.0.0.1 (a certificate it makes in memory; /readyz is always allowed) so that starting it
can wait until it is ready. DynamicResourceAllocation is GA and locked on from 1.35, so 1.37
needs no feature gate for DRA; an older release would need one.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from shim.compat.tails import log_tail
from shim.compat.upstream import releases as upstream

from .daemon import Started, spawn, terminate

START_TIMEOUT_S = 120.0
HTTP_TIMEOUT_S = 5.0


class SchedulerError(RuntimeError):
    """kube-scheduler exited or did not get ready in time; the message quotes its log's tail."""


def scheduler_releases() -> list[upstream.Release]:
    """The releases whose module carries kube-scheduler, oldest first."""
    return [r for r in upstream.releases() if r.carries(upstream.SCHEDULER_PROGRAM)]


def config(kubeconfig: Path) -> dict[str, Any]:
    """A KubeSchedulerConfiguration: the API server of `kubeconfig`, no leader election."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
    }


def command(binary: Path, config_file: Path, kubeconfig: Path, port: int) -> list[str]:
    """kube-scheduler serving its health checks on https://127.0.0.1:`port`; the delegated
    authentication and authorization of its own endpoints ask the same API server."""
    return [
        str(binary),
        f"--config={config_file}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--v=2",
    ]


class Scheduler(Started):
    """kube-scheduler 1.`minor` (its binary: `binary`) for the API server of `kubeconfig`, its
    configuration and log in `folder`."""

    def __init__(self, binary: Path, folder: Path, kubeconfig: Path, port: int) -> None:
        self.binary, self.folder, self.kubeconfig, self.port = binary, folder, kubeconfig, port
        self.log = folder / "kube-scheduler.log"
        self.started_in_s = 0.0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def _start(self) -> None:
        """Start it and wait until /readyz answers ok (its informers synced)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        config_file = self.folder / "kube-scheduler.json"
        config_file.write_text(json.dumps(config(self.kubeconfig), indent=2))
        began = time.monotonic()
        self._process = spawn(command(self.binary, config_file, self.kubeconfig, self.port), self.log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.ready():
            if self._process.poll() is not None:
                raise SchedulerError(f"kube-scheduler exited ({self._process.returncode}):\n{self._tail()}")
            if time.monotonic() > deadline:
                raise SchedulerError(f"kube-scheduler not ready within {START_TIMEOUT_S:g} s\n{self._tail()}")
            time.sleep(0.1)
        self.started_in_s = time.monotonic() - began

    def ready(self) -> bool:
        # Its serving certificate is made in memory at start: nothing to verify it against.
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        url = f"https://127.0.0.1:{self.port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S, context=context) as response:
                return bool(response.read(4096).strip() == b"ok")
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        """SIGTERM, SIGKILL after STOP_GRACE_S; it has exited when this returns."""
        process, self._process = self._process, None
        terminate(process)

    def _tail(self) -> str:
        return log_tail(self.log, 2000)

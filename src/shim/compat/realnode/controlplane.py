"""A control plane for tests: etcd and the upstream kube-apiserver of one release, in one folder.

    with ControlPlane(33, folder) as cp:
        cp.request("POST", "/apis/resource.k8s.io/v1beta2/resourceslices", body=slice_)
        cp.upgrade(34)                        # 1.34's kube-apiserver on the same etcd
        cp.served_versions("resource.k8s.io")  # ["v1"]

Both run on 127.0.0.1 on free ports, as the current user (no root needed), with certificates
made in folder/pki (certs.py); the admin is a client certificate in system:masters. There is no
controller-manager or scheduler. Stopping kills both and waits for them; the folder stays.
docs/real-node.md, "A control plane".
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shim.compat.upstream import releases as upstream

from . import apiserver, certs, images
from .daemon import Started, spawn, terminate
from .node import NodeError, _tail, free_port

START_TIMEOUT_S = 120.0
_VERSION = re.compile(r"v(\d+)(?:(alpha|beta)(\d+))?")
# How a daemon is started: argv, its log file; a Node passes its PrivateHost.spawn.
Spawn = Callable[[Sequence[str], Path], "subprocess.Popen[bytes]"]


class ControlPlaneError(NodeError):
    """A daemon exited or did not get ready in time; the message quotes its log's tail."""


def apiserver_releases() -> list[upstream.Release]:
    """The releases whose module carries kube-apiserver, oldest first."""
    return [r for r in upstream.releases() if r.carries(upstream.APISERVER_PROGRAM)]


def release(minor: int) -> upstream.Release:
    for found in apiserver_releases():
        if found.minor == minor:
            return found
    known = ", ".join(f"1.{r.minor}" for r in apiserver_releases())
    raise upstream.JudgeUnavailable(f"no judges/k8s-1.{minor} module carries kube-apiserver (there: {known})")


class ControlPlane(Started):
    """etcd and kube-apiserver 1.`minor` in `folder` (binaries built or taken from the cache)."""

    def __init__(
        self,
        minor: int,
        folder: Path,
        *,
        spawn: Spawn = spawn,
        log: bool = False,
        resource_versions: Sequence[str] = (),
        gates_on: Sequence[str] = (),
    ) -> None:
        """``resource_versions``: resource.k8s.io versions to serve besides the release's
        defaults (over upgrades too), e.g. v1beta1 for a 1.33 kubelet; ``gates_on``: feature
        gates to turn on in kube-apiserver besides its defaults."""
        self.folder, self.minor, self._spawn, self._log = folder, minor, spawn, log
        self.resource_versions = tuple(resource_versions)
        self.gates_on = tuple(gates_on)
        self.release = release(minor)  # JudgeUnavailable for a release without kube-apiserver
        self.etcd = upstream.etcd_for(self.release)  # etcd stays at this one over upgrades
        self.pki = folder / "pki"
        self.ca_file = self.pki / "ca.crt"
        self.admin_kubeconfig = folder / "admin.kubeconfig"
        self.etcd_log = folder / "etcd.log"
        self.port = 0
        self.etcd_url = ""
        self.etcd_started_in_s = self.apiserver_started_in_s = 0.0
        self._admin: certs.KeyPair | None = None
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def apiserver_log(self) -> Path:
        return self.folder / f"kube-apiserver-1.{self.minor}.log"

    @property
    def pids(self) -> dict[str, int]:
        """The running daemons' process IDs, by name."""
        running = {"etcd": self._etcd, "kube-apiserver": self._apiserver}
        return {name: p.pid for name, p in running.items() if p is not None and p.poll() is None}

    # -- lifecycle ---------------------------------------------------------------------------

    def _start(self) -> None:
        """Certificates (kept if the folder has them), etcd, then kube-apiserver, each ready."""
        etcd_binary = upstream.build_etcd(self.etcd, log=self._log)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._make_certificates()
        began = time.monotonic()
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        argv = apiserver.etcd_command(etcd_binary, self.folder / "etcd", client_port, peer_port)
        self._etcd = self._spawn(argv, self.etcd_log)
        self._wait(self._etcd_healthy, "etcd healthy", self.etcd_log)
        self.etcd_started_in_s = time.monotonic() - began
        self.port = free_port()
        self._start_apiserver()

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd; both have exited when this returns."""
        try:
            terminate(self._apiserver)
        finally:
            self._apiserver = None
            terminate(self._etcd)
            self._etcd = None

    def restart(self) -> None:
        """kube-apiserver stopped and started again (same release, port and etcd data)."""
        self.upgrade(self.minor)

    def upgrade(self, minor: int) -> None:
        """Stop this kube-apiserver and start release 1.`minor`'s on the same etcd and port."""
        target = release(minor)
        upstream.build(target, program=upstream.APISERVER_PROGRAM, log=self._log)
        terminate(self._apiserver)
        self._apiserver = None
        self.minor, self.release = minor, target
        self._start_apiserver()

    def _make_certificates(self) -> None:
        ca = certs.CertificateAuthority.create(self.pki)
        if not (self.pki / "apiserver.crt").is_file():
            ca.issue("apiserver", common_name="kube-apiserver", ips=["127.0.0.1"], dns=["localhost"])
            ca.issue("admin", common_name="devshim-admin", organizations=["system:masters"])
            certs.public_key(
                certs.new_key(self.pki / "service-account.key"), self.pki / "service-account.pub"
            )
        self._admin = certs.KeyPair(self.pki / "admin.crt", self.pki / "admin.key")

    def _start_apiserver(self) -> None:
        binary = upstream.build(self.release, program=upstream.APISERVER_PROGRAM, log=self._log)
        argv = apiserver.apiserver_command(
            binary, self.minor, self.pki, self.etcd_url, self.port, self.resource_versions, self.gates_on
        )
        began = time.monotonic()
        self._apiserver = self._spawn(argv, self.apiserver_log)
        self._wait(self._ready, f"kube-apiserver {self.release.version} ready (/readyz)", self.apiserver_log)
        self.apiserver_started_in_s = time.monotonic() - began
        assert self._admin is not None
        user = {"client-certificate": str(self._admin.cert), "client-key": str(self._admin.key)}
        apiserver.write_kubeconfig(self.admin_kubeconfig, self.url, self.ca_file, user)

    # -- the API -------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        """The JSON answer to `method path` as the admin (or bearer `token`); APIError if not 2xx."""
        return apiserver.https_request(
            self.url + path, method, ca=self.ca_file, client=self._admin, token=token, body=body
        )

    def kubeconfig_for_token(self, token: str, path: Path) -> Path:
        return apiserver.write_kubeconfig(path, self.url, self.ca_file, {"token": token})

    def served_versions(self, group: str) -> list[str]:
        """The versions of API `group` the server serves (discovery), newest first ("" is core)."""
        found = self.request("GET", f"/apis/{group}" if group else "/api")
        versions = [v["version"] for v in found.get("versions", [])] if group else list(found["versions"])
        return sorted(versions, key=version_priority, reverse=True)

    def user_info(self, token: str | None = None) -> dict[str, Any]:
        """Who the server says the caller is (a SelfSubjectReview): username, groups, extra."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        found = self.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review, token)
        return dict(found["status"]["userInfo"])

    def ensure(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """`obj` created at collection `path`, or the one of its name already there."""
        try:
            return dict(self.request("POST", path, obj))
        except apiserver.APIError as err:
            if err.status != 409:
                raise
        return dict(self.request("GET", f"{path}/{obj['metadata']['name']}"))

    def node_bound_token(self, namespace: str, service_account: str, node_name: str) -> str:
        """A token of `service_account` bound to a pod of it on Node `node_name` (each made if
        missing), so the server adds the node's name to the token's user:
        extra["authentication.kubernetes.io/node-name"]."""
        ns = f"/api/v1/namespaces/{namespace}"
        self.ensure("/api/v1/namespaces", {"metadata": {"name": namespace}})
        self.ensure(f"{ns}/serviceaccounts", {"metadata": {"name": service_account}})
        self.ensure("/api/v1/nodes", {"metadata": {"name": node_name}})
        pod = self.ensure(f"{ns}/pods", _pod(f"{service_account}-{node_name}", service_account, node_name))
        bound = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600, "boundObjectRef": bound},
        }
        found = self.request("POST", f"{ns}/serviceaccounts/{service_account}/token", request)
        return str(found["status"]["token"])

    # -- waiting -------------------------------------------------------------------------------

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=5) as response:
                return b'"true"' in response.read(4096)
        except (OSError, urllib.error.URLError):
            return False

    def _ready(self) -> bool:
        try:
            return bool(self.request("GET", "/readyz") == "ok")
        except (OSError, apiserver.APIError):
            return False

    def _wait(self, check: Callable[[], bool], what: str, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not check():
            for process, name in ((self._etcd, "etcd"), (self._apiserver, "kube-apiserver")):
                if process is not None and process.poll() is not None:
                    code = process.returncode
                    raise ControlPlaneError(f"{name} exited ({code}) waiting for {what}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"no {what} within {START_TIMEOUT_S:g} s\n{_tail(log)}")
            time.sleep(0.1)


def version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' order of API versions: GA above beta above alpha, then by number."""
    found = _VERSION.fullmatch(version)
    if found is None:
        return (-1, 0, 0)
    major, level, number = found.groups()
    return ({"alpha": 0, "beta": 1}.get(level, 2), int(major), int(number or 0))


def _pod(name: str, service_account: str, node_name: str) -> dict[str, Any]:
    """A pod of `service_account` already on `node_name` (no scheduler), runnable by a real node."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node_name,
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "hostNetwork": True,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": images.TEST_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "exec sleep infinity"],
            }],
        },
    }  # fmt: skip

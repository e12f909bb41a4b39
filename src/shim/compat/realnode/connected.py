"""A connected node: a control plane, kube-scheduler and one Node whose kubelet registers with the
API server, all of one release, for DRA end to end.

    with ConnectedNode(37, folder) as cluster:
        cluster.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", device_class)
        cluster.create_pod(api_pod("gpu", "env; sleep infinity", claims={"gpu": "claim-a"}))
        cluster.wait_for_pod("gpu", running, "running")
        cluster.node.container_log("gpu", static=False)

etcd, kube-apiserver (controlplane.py) and kube-scheduler (scheduler.py) run as plain processes
on loopback; the Node (node.py) runs containerd 2.x with CDI (containerd.with_cdi(), reading
specs from `node.cdi_dir` only) and the kubelet with a kubeconfig of its own: a client
certificate for `system:node:<name>` in `system:nodes`, so the API server's Node authorizer
judges what it reads, as in a cluster. No kube-controller-manager runs: nothing makes
ServiceAccount tokens, ResourceClaims from templates or removes the not-ready taint the
TaintNodesByCondition admission plugin puts on a new Node (and without CNI the Node stays
NotReady), so api_pod() makes pods that mount no token, tolerate that taint and name plain
ResourceClaims; `default` ServiceAccount is created here (the ServiceAccount admission plugin
refuses a pod whose account does not exist). docs/real-node.md, "A connected node (DRA)".
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shim.compat.tails import log_tail
from shim.compat.upstream import releases as upstream

from . import apiserver, certs, containerd, kubelet
from .controlplane import ControlPlane
from .daemon import Started
from .node import Node, NodeError, Pod, free_port, pod_manifest
from .scheduler import Scheduler

NODE_USER = f"system:node:{kubelet.NODE_NAME}"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
NODE_REGISTER_TIMEOUT_S = 60.0
NAMESPACE = "default"


def api_pod(
    name: str, script: str, claims: Mapping[str, str] | None = None, limits: Mapping[str, int] | None = None
) -> Pod:
    """pod_manifest's pod, for the API server: no service-account token, the not-ready taint
    tolerated, and each of `claims` (the pod's name for it: a ResourceClaim's name) in
    spec.resourceClaims and in its container's resources.claims."""
    pod = copy.deepcopy(pod_manifest(name, script, limits))
    spec = pod["spec"]
    spec["automountServiceAccountToken"] = False
    spec["tolerations"] = [{"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    if claims:
        spec["resourceClaims"] = [{"name": n, "resourceClaimName": c} for n, c in claims.items()]
        container = spec["containers"][0]
        container.setdefault("resources", {})["claims"] = [{"name": n} for n in claims]
    return pod


def connected_releases() -> list[upstream.Release]:
    """The releases whose module carries kube-apiserver, kube-scheduler and the kubelet."""
    programs = (upstream.APISERVER_PROGRAM, upstream.SCHEDULER_PROGRAM, upstream.KUBELET_PROGRAM)
    return [r for r in upstream.releases() if all(r.carries(p) for p in programs)]


class ConnectedNode(Started):
    """Release 1.`minor`'s control plane, kube-scheduler and connected Node, inside `folder`
    (the node's own folder; the control plane's in control-plane/, the scheduler's in
    scheduler/). Binaries are built, or taken from the judge's cache, on start."""

    def __init__(self, minor: int, folder: Path, *, log: bool = False) -> None:
        self.minor, self.folder, self._log = minor, folder, log
        self.plane = ControlPlane(minor, folder / "control-plane", log=log)
        self.release = self.plane.release
        self.node_kubeconfig = folder / "kubelet.kubeconfig"
        self.scheduler: Scheduler | None = None
        self._node: Node | None = None
        self.started_in_s = 0.0

    @property
    def node(self) -> Node:
        assert self._node is not None, "start() first"
        return self._node

    @property
    def node_name(self) -> str:
        return kubelet.NODE_NAME

    # -- lifecycle ---------------------------------------------------------------------------

    def _start(self) -> None:
        """Everything started and ready (the Node registered)."""
        kubelet_binary = upstream.build(self.release, program=upstream.KUBELET_PROGRAM, log=self._log)
        scheduler_binary = upstream.build(self.release, program=upstream.SCHEDULER_PROGRAM, log=self._log)
        runtime = containerd.with_cdi(log=self._log)
        began = time.monotonic()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.plane.start()
        ca = certs.CertificateAuthority.create(self.plane.pki)
        pair = ca.issue("kubelet", common_name=NODE_USER, organizations=["system:nodes"])
        user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
        apiserver.write_kubeconfig(self.node_kubeconfig, self.plane.url, self.plane.ca_file, user)
        self.plane.ensure(
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": "default"}}
        )
        self.scheduler = Scheduler(
            scheduler_binary, self.folder / "scheduler", self.plane.admin_kubeconfig, free_port()
        )
        self.scheduler.start()
        self._node = Node(self.folder, kubelet_binary, self.minor, kubeconfig=self.node_kubeconfig,
                          runtime=runtime)  # fmt: skip
        self._node.start()
        self._wait(self._registered, f"Node {self.node_name} registered", NODE_REGISTER_TIMEOUT_S)
        self.started_in_s = time.monotonic() - began

    def stop(self) -> None:
        """The node, then the scheduler, then the control plane; all have exited on return."""
        try:
            if self._node is not None:
                self._node.stop()
        finally:
            try:
                if self.scheduler is not None:
                    self.scheduler.stop()
            finally:
                self.plane.stop()

    # -- the API -------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer to `method path` as the admin; APIError if not 2xx."""
        return self.plane.request(method, path, body)

    def create_pod(self, manifest: Pod) -> Pod:
        return dict(self.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", manifest))

    def pod(self, name: str) -> Pod | None:
        """The pod as the API server has it, or None if there is none of that name."""
        try:
            return dict(self.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"))
        except apiserver.APIError as err:
            if err.status == 404:
                return None
            raise

    def delete_pod(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")

    def wait_for_pod(
        self, name: str, check: Callable[[Pod | None], bool], what: str, timeout: float = 60.0
    ) -> Pod | None:
        """The pod (None once it is gone) when `check` holds for it; NodeError naming `what`,
        with its last status, if not within `timeout`."""
        seen: list[Pod | None] = [None]

        def holds() -> bool:
            seen[0] = self.pod(name)
            return check(seen[0])

        self._wait(holds, f"pod {name}: {what}", timeout, lambda: str((seen[0] or {}).get("status"))[:2000])
        return seen[0]

    def _registered(self) -> bool:
        try:
            self.request("GET", f"/api/v1/nodes/{self.node_name}")
        except apiserver.APIError:
            return False
        return True

    def _wait(
        self, check: Callable[[], bool], what: str, timeout: float, detail: Callable[[], str] | None = None
    ) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                seen = f"; last seen: {detail()}" if detail else ""
                logs = self.node.kubelet_log if self._node is not None else self.plane.apiserver_log
                tail = log_tail(logs, 2000)
                raise NodeError(f"no {what} within {timeout:g} s{seen}\n{tail}")
            time.sleep(0.2)

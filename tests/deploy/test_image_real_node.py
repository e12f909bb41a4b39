"""The image built without Docker (scripts/build_image.py) running the chart's pod on a real node:
the upstream kubelet and containerd of shim.compat.realnode, no Docker, no registry.

What runs is what `helm template` renders for the DaemonSet with the chart's sim-driver values:
the same container (image, args, ports, probes, resources, securityContext, mounts). A node has no
API server to serve a ConfigMap and no CNI, so four things change, and nothing else: the pod is
a static pod on the host network, the ConfigMap's files are a hostPath folder, the kubelet's
folders are the node's (its hostPaths substituted by volume name: a new hostPath in the chart
fails here until it is placed), and the ops port is a free one (config and containerPort alike,
so the probes follow). The pod must get Ready (devshim's /readyz: registered with the kubelet),
then a second pod asking for the sim's resource gets a device, as the kubelet's PodResources
says. The image is imported
into the node's containerd (ctr images import) under the name the chart asks for, and the pod's
container must report that image's digest.

The chart's DRA values run the same way on the connected node (shim.compat.realnode.connected:
API server, scheduler, kubelet, containerd with CDI), rendered for its kubelet root and CDI folder:
the chart's account, RBAC, admission policy and DeviceClass go to the API server; three more
changes, since a static pod names no service account and no kube-proxy runs: the token is one of
that account bound to a pod on the node, in a hostPath folder where the projected volume was, and
the API server's address is given as the kubelet would give the kubernetes Service's. devshim
publishes through the policy, and a claim of the chart's class, allocated by the real scheduler,
is prepared through the pod's DRA socket: the claim's pod runs.

Needs root, containerd, runc, Go (the kubelet), helm and debootstrap. Cost (docs/operations.md):
the image build, 80 s cold and a second cached, then with it cached about 10 s for the node and
its pods, 18 s for the connected node's DRA run: --full-matrix only, for the cold build and
debootstrap, which CI does not install.
"""

from __future__ import annotations

import copy
import json
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shim.compat.realnode import Node, NodeUnavailable, pod_manifest
from shim.compat.realnode.connected import ConnectedNode, api_pod
from shim.compat.realnode.kubelet import pod_name
from shim.compat.realnode.node import free_port
from shim.compat.upstream import releases as upstream
from tests.deploy.test_helm import render
from tests.deploy.test_manifests import NAMESPACE, config_files, devshim_container, one
from tests.deploy.tools import DEPLOY, require_image
from tests.support.devshim_process import http_get
from tests.support.dra import Published
from tests.support.real_node import (
    DEFAULT,
    allocatable_ids,
    check_machine,
    connected_node,
    kubelet_pods,
    one_node_at_a_time,
    report,
    reporting,
    running,
    wait_until,
)
from tests.support.toolchains import unavailable
from tests.support.unix import short_temp_dir

VALUES = DEPLOY / "examples" / "helm" / "sim-driver.yaml"  # the chart's sim-driver values
SIM = "example.com/sim"  # what those values' driver serves
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def image() -> Path:
    return require_image()


@pytest.fixture
def node(image: Path) -> Iterator[Node]:
    """The newest kubelet's node with the image imported, stopped afterwards."""
    check_machine()
    release = DEFAULT[-1]
    kubelet = upstream.build(release, program=upstream.KUBELET_PROGRAM, log=False)
    with one_node_at_a_time(), short_temp_dir("ds-img-") as folder:
        node = Node(folder, kubelet, release.minor)
        try:
            try:
                node.start()
            except NodeUnavailable as missing:
                unavailable(str(missing))
            node.import_image(image)
            yield node
        finally:
            node.stop()


def static_pod(docs: tuple[Doc, ...], node: Node, port: int, api: Doc | None = None) -> Doc:
    """The DaemonSet's pod as a static pod of `node` (the four changes the module names); with
    `api` (a folder of its token, CA and namespace, and the API server's address), the three the
    DRA test names too."""
    daemonset = one(docs, "DaemonSet")
    template = copy.deepcopy(daemonset["spec"]["template"])
    spec = template["spec"]
    config_dir, _ = config_files(docs, node.folder / "config")
    config = yaml.safe_load((config_dir / "config.yaml").read_text())
    config["http"]["port"] = port
    (config_dir / "config.yaml").write_text(yaml.safe_dump(config))
    host = {
        "device-plugins": node.device_plugins_dir,
        "plugins-registry": node.plugins_registry_dir,
        "pod-resources": node.pod_resources_socket.parent,
        "state": node.folder / "devshim-state",
        "dev": Path("/dev"),  # the host's own, as on any node
    }
    if api is not None:  # DRA: its own folders, where the chart mounts them (kubeletRootDir)
        host["cdi"] = node.cdi_dir
        host |= {f"dra-plugin-{i}": node.plugins_dir / name for i, name in enumerate(api["drivers"])}
    for volume in spec["volumes"]:
        if volume["name"] == "api-token" and api is not None:
            volume["hostPath"] = {"path": str(api["folder"]), "type": "Directory"}
            del volume["projected"]
        elif "configMap" in volume:
            volume["hostPath"] = {"path": str(config_dir), "type": "Directory"}
            del volume["configMap"]
        elif "hostPath" in volume:
            volume["hostPath"]["path"] = str(host.pop(volume["name"]))
    [ops] = [p for p in devshim_container(daemonset)["ports"] if p["name"] == "ops"]
    [container] = [c for c in spec["containers"] if c["name"] == "devshim"]
    container["ports"] = [{**ops, "containerPort": port}]
    spec["hostNetwork"] = True
    if api is not None:
        # No kube-proxy routes the kubernetes Service: its address is the API server's own, as
        # the kubelet would give it; a static pod may name no service account.
        container["env"] += [{"name": "KUBERNETES_SERVICE_HOST", "value": api["host"]},
                             {"name": "KUBERNETES_SERVICE_PORT", "value": api["port"]}]  # fmt: skip
        del spec["serviceAccountName"]
    metadata = {"name": "devshim", "namespace": "default", "labels": template["metadata"]["labels"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def digests(archive: Path) -> set[str]:
    """The image's manifest and config digests, as containerd may report either."""
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        manifest_digest = index["manifests"][0]["digest"]
        blob = tar.extractfile(f"blobs/sha256/{manifest_digest.removeprefix('sha256:')}")
        manifest = json.load(blob)  # type: ignore[arg-type]
    return {manifest_digest, manifest["config"]["digest"]}


def ready(pod: Doc) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


@pytest.mark.full_matrix  # about 10 s with the image cached, 80 s more to build it: --full-matrix
@pytest.mark.timeout(600)
def test_the_charts_pod_from_the_image_serves_a_device_to_another_pod(node: Node, image: Path) -> None:
    docs = render("--values", str(VALUES))
    pod = static_pod(docs, node, free_port())
    assert pod["spec"]["containers"][0]["image"].startswith("devshim:")  # the chart's, unchanged
    node.run_pod(pod)
    try:
        seen = node.wait_for_pod("devshim", ready, "Ready (devshim registered with the kubelet)", 120)
        [status] = [s for s in seen["status"]["containerStatuses"] if s["name"] == "devshim"]
        assert any(d in status["imageID"] for d in digests(image)), status["imageID"]
        wait_until(lambda: len(allocatable_ids(node, SIM)) == 4, "the kubelet lists the sim's 4 devices")

        node.run_pod(pod_manifest("consumer", reporting("echo SIM_DEVICES=$SIM_DEVICES"), {SIM: 1}))
        node.wait_for_pod("consumer", running, "running")
        granted = report(node, "consumer")["SIM_DEVICES"]
        [listed] = [p for p in kubelet_pods(node) if p.name == pod_name("consumer")]
        held = [d.id for d in listed.container("main").devices if d.resource == SIM]
        assert held == [granted] and granted.startswith("sim-")
    except BaseException:
        log = node.container_log("devshim", "devshim")[-6000:]
        sys.stderr.write(f"--- devshim's container log:\n{log}\n")
        raise


DRA_VALUES = DEPLOY / "examples" / "helm" / "dra.yaml"  # the chart's DRA values: sim.example.com
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
CLUSTER_KINDS = {  # the chart's cluster objects, where the API server takes them
    "ServiceAccount": f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "ValidatingAdmissionPolicy": f"{ADMISSION}/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": f"{ADMISSION}/validatingadmissionpolicybindings",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
}


def kubelet_side(port: int, driver: str) -> Doc:
    """devshim's /status of its DRA driver's kubelet side ({} while it cannot be read)."""
    try:
        code, body = http_get(f"http://127.0.0.1:{port}/status")
    except OSError:
        return {}
    found = json.loads(body).get("dra", {}).get(driver, {}).get("kubelet", {}) if code == 200 else {}
    return dict(found)


@pytest.fixture
def cluster(image: Path) -> Iterator[ConnectedNode]:
    """The newest connected release with the image imported, stopped afterwards."""
    with connected_node("ds-imgdra-") as cluster:
        cluster.node.import_image(image)
        yield cluster


@pytest.mark.full_matrix
@pytest.mark.timeout(600)
def test_the_charts_dra_pod_from_the_image_prepares_a_claim_the_scheduler_allocated(
    cluster: ConnectedNode, image: Path
) -> None:
    """The chart's DRA values (dra.enabled, its DeviceClass) rendered for the node's kubelet root
    and CDI folder: the chart's service account, RBAC, admission policy and DeviceClass applied
    to the API server; the pod from the image, with a token of that account bound to a pod on
    the node (a static pod names no service account) and the API server's address (no
    kube-proxy), publishes its pool through the policy; a ResourceClaim of the chart's class is
    allocated by the real scheduler and prepared through the pod's DRA socket: its pod runs."""
    node, plane = cluster.node, cluster.plane
    flags = ["--values", str(DRA_VALUES), "--set", "dra.deviceClasses=true"]
    flags += ["--set", f"kubeletRootDir={node.kubelet_root}", "--set", f"config.dra.cdi_dir={node.cdi_dir}"]
    docs = render(*flags)
    drivers = [d["name"] for d in yaml.safe_load(config_files(docs, node.folder / "rendered")[0].joinpath(
        "config.yaml").read_text())["dra"]["drivers"]]  # fmt: skip
    plane.ensure("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    for doc in docs:
        if doc["kind"] in CLUSTER_KINDS:
            plane.ensure(CLUSTER_KINDS[doc["kind"]], doc)
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    token_dir = node.folder / "api-token"
    token_dir.mkdir()
    (token_dir / "token").write_text(plane.node_bound_token(NAMESPACE, account, cluster.node_name))
    (token_dir / "ca.crt").write_bytes(plane.ca_file.read_bytes())
    (token_dir / "namespace").write_text(NAMESPACE)
    host, _, port = plane.url.removeprefix("https://").rpartition(":")
    api = {"folder": token_dir, "host": host, "port": port, "drivers": drivers}
    ops = free_port()
    node.run_pod(static_pod(docs, node, ops, api))
    try:
        node.wait_for_pod("devshim", ready, "Ready (devshim registered with the kubelet)", 120)
        pool = Published(plane, "v1", cluster.node_name, drivers[0])
        wait_until(lambda: (found := pool.pool()) is not None and len(found) == 4, "the pool published")
        wait_until(
            lambda: kubelet_side(ops, drivers[0]).get("registered"), "the kubelet registered its DRA plugin"
        )
        claim = {
            "metadata": {"name": "one-sim"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "sim",
                            "exactly": {"deviceClassName": one(docs, "DeviceClass")["metadata"]["name"]},
                        }
                    ]
                }
            },
        }
        cluster.request("POST", CLAIMS, claim)
        cluster.create_pod(api_pod("claimant", "exec sleep infinity", claims={"sim": "one-sim"}))
        cluster.wait_for_pod(
            "claimant", lambda p: bool(p and p["status"].get("phase") == "Running"), "running"
        )
        allocated = cluster.request(
            "GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/one-sim"
        )
        [result] = allocated["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (drivers[0], cluster.node_name)
        assert kubelet_side(ops, drivers[0])["prepared_claims"] == 1
    except BaseException:
        log = node.container_log("devshim", "devshim")[-6000:]
        kubelet = [line for line in node.kubelet_log.read_text(errors="replace").splitlines()
                   if "claim" in line.lower() or "dra" in line.lower()][-40:]  # fmt: skip
        sys.stderr.write(f"--- devshim's container log:\n{log}\n--- the kubelet on claims:\n")
        sys.stderr.write("\n".join(kubelet) + "\n")
        raise

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

Needs root, containerd, runc, Go (the kubelet), helm and debootstrap. Cost (docs/operations.md):
the image build, about a minute and a half cold and a second cached, then about 80 s for the
node and pods: --full-matrix only.
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
from shim.compat.realnode.kubelet import pod_name
from shim.compat.realnode.node import free_port
from shim.compat.upstream import releases as upstream
from tests.deploy.test_helm import render
from tests.deploy.test_manifests import config_files, devshim_container, one
from tests.deploy.tools import DEPLOY, require_image
from tests.support.real_node import (
    DEFAULT,
    allocatable_ids,
    check_machine,
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


def static_pod(docs: tuple[Doc, ...], node: Node, port: int) -> Doc:
    """The DaemonSet's pod as a static pod of `node` (the four changes the module names)."""
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
    for volume in spec["volumes"]:
        if "configMap" in volume:
            volume["hostPath"] = {"path": str(config_dir), "type": "Directory"}
            del volume["configMap"]
        elif "hostPath" in volume:
            volume["hostPath"]["path"] = str(host.pop(volume["name"]))
    [ops] = [p for p in devshim_container(daemonset)["ports"] if p["name"] == "ops"]
    [container] = [c for c in spec["containers"] if c["name"] == "devshim"]
    container["ports"] = [{**ops, "containerPort": port}]
    spec["hostNetwork"] = True
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


@pytest.mark.full_matrix  # about 80 s with the image cached: with --full-matrix, and by hand
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

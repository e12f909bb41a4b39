"""The final judge of DRA: a connected real node (shim.compat.realnode.connected) runs a pod that
claims one of devshim's devices, and every step is upstream's own.

etcd, kube-apiserver and kube-scheduler of the newest release, its kubelet registered with them
as a node, containerd 2.x with CDI (built from judges/containerd-2.N: Debian's 1.6 has none),
and `devshim run` as the DRA driver gpu.example.com with the sim behind it. devshim publishes the
node's pool; the test creates a DeviceClass, a ResourceClaim and a pod using it through the API
server; the real scheduler allocates a device and binds the pod; the real kubelet prepares the
claim through devshim's DRA socket (registered by its plugin watcher); containerd resolves the
CDI ID devshim answered from devshim's spec and runc starts the container, which reports its env
and device node. Deleting the pod, the kubelet unprepares and devshim's spec goes.

A pod on the device-plugin path gets a CDI device the same way, from the spec devshim's driver
ships (protocol 1.2).

Needs root, runc, Go (the kubelet, kube-apiserver, kube-scheduler, etcd and containerd are
built into the judge's cache: minutes cold, by tests/support/prebuild.py in CI) and openssl. The
first end-to-end test (a DRA claim's pod through the real scheduler, kubelet and containerd with
CDI) runs by default, at the newest connected release; the others with --full-matrix
(docs/real-node.md, "A connected node (DRA)", has their cost). The pure parts
(containerd 2.x's configuration, the scheduler's, the kubelet's connected command line, the
API pods) are checked in every run.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import containerd, images, kubelet, scheduler
from shim.compat.realnode.connected import NOT_READY_TAINT, ConnectedNode, api_pod, connected_releases
from shim.compat.realnode.kubelet import NODE_NAME
from shim.compat.upstream import releases as upstream
from tests.support.dra import GPU_DRIVER, Published
from tests.support.real_node import END, Devshim, connected_node, reporting, wait_until

GPU = "example.com/gpu"
FPGA = "example.com/fpga"
PYTHON_SIM = ["-m", "devshim_adapters.sim"]
ZERO = "1:5"  # /dev/zero's major and minor, in hex as stat prints them
RESOURCE = "/apis/resource.k8s.io/v1"
CLAIMS = f"{RESOURCE}/namespaces/default/resourceclaims"
RELEASES = connected_releases()


@pytest.fixture
def cluster() -> Iterator[ConnectedNode]:
    """The newest release's control plane, scheduler and connected node, stopped afterwards."""
    with connected_node("ds-dra-") as cluster:
        yield cluster


def _devshim_settings(cluster: ConnectedNode, control: Path | None = None) -> dict[str, Any]:
    """The sim serving two GPUs, each grant an env and /dev/zero as /dev/simgpu, as the DRA driver
    gpu.example.com of the node, its sockets and CDI specs where the kubelet and containerd look."""
    node = cluster.node
    sim = {
        "name": GPU,
        "count": 2,
        "grant": {
            "envs": {"SIM_DEVICES": "{ids}"},
            "device_nodes": [{"container_path": "/dev/simgpu", "host_path": "/dev/zero"}],
        },
    }
    # What its grant holds, declared.
    driver = _sim_driver(
        node.folder, "sim", sim, {"envs": ["SIM_DEVICES"], "device_nodes": ["/dev/zero"]}, control
    )
    return {
        "drivers": [driver],
        "dra": {
            "plugins_dir": str(node.plugins_dir),
            "cdi_dir": str(node.cdi_dir),
            "node_name": NODE_NAME,
            "kubeconfig": str(cluster.plane.admin_kubeconfig),
            "drivers": [{"name": GPU_DRIVER, "resources": [GPU]}],
        },
    }


def _sim_driver(
    folder: Path, name: str, resource: dict[str, Any], policy: dict[str, Any], control: Path | None = None
) -> dict[str, Any]:
    """The sim serving ``resource`` (its config file written in ``folder``), as the drivers[]
    entry ``name`` declaring it and ``policy``; ``control``: its control file."""
    config = folder / f"{name}.json"
    extra = {"control_file": str(control)} if control is not None else {}
    config.write_text(json.dumps({"resources": [resource], **extra}))
    command = [sys.executable, *PYTHON_SIM, "--config", str(config)]
    return {
        "name": name,
        "user": "root",
        "command": command,
        "resources": [resource["name"]],
        "policy": policy,
    }


def _device_class(cluster: ConnectedNode) -> None:
    """The DeviceClass gpu.example.com: every device of that driver (CEL on device.driver)."""
    cluster.request("POST", f"{RESOURCE}/deviceclasses", {
        "metadata": {"name": GPU_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU_DRIVER}"'}}]},
    })  # fmt: skip


def _claim(cluster: ConnectedNode, name: str, count: int) -> None:
    """A plain ResourceClaim (no controller-manager runs to make one from a template): one
    request, `gpu`, for `count` devices of the class."""
    request = {"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER, "count": count}}
    cluster.request(
        "POST", CLAIMS, {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}
    )


def _dra_status(devshim: Devshim) -> dict[str, Any]:
    return dict(((devshim.status() or {}).get("dra") or {}).get(GPU_DRIVER) or {})


def _report(cluster: ConnectedNode, pod: str) -> dict[str, str]:
    def finished() -> str | None:
        return text if END in (text := cluster.node.container_log(pod, static=False)) else None

    log = wait_until(finished, f"{pod} reported")
    return dict(line.partition("=")[::2] for line in log.splitlines() if "=" in line)


def test_a_pod_gets_the_device_the_scheduler_allocated_through_devshim_and_cdi(
    cluster: ConnectedNode,
) -> None:
    """Slices → the scheduler's allocation → the kubelet's prepare through devshim → containerd's
    CDI injection → the container's env and device node; the pod deleted, the claim unprepared."""
    node = cluster.node
    with Devshim(node, _devshim_settings(cluster)) as devshim:
        pool = Published(cluster.plane, "v1", NODE_NAME)
        wait_until(lambda: (found := pool.pool()) is not None and set(found) == {"gpu-0", "gpu-1"},
                   "devshim published gpu-0 and gpu-1")  # fmt: skip
        wait_until(lambda: _dra_status(devshim).get("kubelet", {}).get("registered"),
                   "the kubelet's plugin watcher registered devshim's DRA plugin")  # fmt: skip
        _device_class(cluster)
        _claim(cluster, "one-gpu", count=1)
        script = reporting("echo SIM_DEVICES=$SIM_DEVICES", "echo NODE=`stat -c %t:%T /dev/simgpu`")
        cluster.create_pod(api_pod("gpu", script, claims={"gpu": "one-gpu"}))
        pod = cluster.wait_for_pod(
            "gpu", lambda p: bool(p and p["status"].get("phase") == "Running"), "running"
        )
        assert pod is not None and pod["spec"]["nodeName"] == NODE_NAME  # bound by the scheduler

        claim = cluster.request("GET", f"{CLAIMS}/one-gpu")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (GPU_DRIVER, NODE_NAME)
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["gpu"]
        seen = _report(cluster, "gpu")
        assert seen["SIM_DEVICES"] == result["device"]  # the sim's ID is the device's name here
        assert seen["NODE"] == ZERO
        spec = node.cdi_dir / f"devshim-{GPU_DRIVER}-{claim['metadata']['uid']}.json"
        assert spec.is_file(), sorted(p.name for p in node.cdi_dir.iterdir())
        kubelet_side = _dra_status(devshim)["kubelet"]
        assert kubelet_side["service"] == "v1.DRAPlugin" and kubelet_side["prepared_claims"] == 1

        cluster.delete_pod("gpu")
        cluster.wait_for_pod("gpu", lambda p: p is None, "deleted by the kubelet once stopped")
        wait_until(lambda: not spec.exists(), "the kubelet unprepared the claim (devshim's CDI spec gone)")
        assert _dra_status(devshim)["kubelet"]["prepared_claims"] == 0


@pytest.mark.full_matrix
def test_a_claim_for_more_devices_than_published_leaves_the_pod_unschedulable(cluster: ConnectedNode) -> None:
    """The scheduler reads devshim's pool: a claim for three of its two GPUs cannot be allocated,
    the pod stays Pending with the DRA plugin's reason, and devshim is asked to prepare nothing."""
    with Devshim(cluster.node, _devshim_settings(cluster)) as devshim:
        pool = Published(cluster.plane, "v1", NODE_NAME)
        wait_until(lambda: (found := pool.pool()) is not None and len(found) == 2, "devshim published 2 GPUs")
        _device_class(cluster)
        _claim(cluster, "three-gpus", count=3)
        cluster.create_pod(api_pod("greedy", "exec sleep infinity", claims={"gpu": "three-gpus"}))

        pod = cluster.wait_for_pod("greedy", _unschedulable, "unschedulable")
        assert pod is not None and "nodeName" not in pod["spec"] and pod["status"]["phase"] == "Pending"
        [condition] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert "cannot allocate all claims" in condition["message"]
        assert _dra_status(devshim)["kubelet"]["prepared_claims"] == 0
        assert not list(cluster.node.cdi_dir.iterdir())


@pytest.mark.full_matrix
def test_a_pod_asking_for_the_extended_resource_gets_a_dra_device(cluster: ConnectedNode) -> None:
    """DRAExtendedResource (KEP-5004; GA and on in 1.37), the last stage of a migration: the pool
    served through DRA only and a DeviceClass naming example.com/gpu as its extended resource; a
    pod asking for `example.com/gpu: 1`, as it asked a device plugin, is given a device by the
    scheduler in a claim the scheduler makes itself, which the kubelet prepares through devshim."""
    node = cluster.node
    settings = _devshim_settings(cluster)
    settings["dra"]["drivers"][0]["device_plugin"] = False
    with Devshim(node, settings) as devshim:
        pool = Published(cluster.plane, "v1", NODE_NAME)
        wait_until(lambda: (found := pool.pool()) is not None and len(found) == 2, "devshim published 2 GPUs")
        wait_until(lambda: _dra_status(devshim).get("kubelet", {}).get("registered"),
                   "the kubelet's plugin watcher registered devshim's DRA plugin")  # fmt: skip
        cluster.request("POST", f"{RESOURCE}/deviceclasses", {
            "metadata": {"name": GPU_DRIVER},
            "spec": {
                "selectors": [{"cel": {"expression": f'device.driver == "{GPU_DRIVER}"'}}],
                "extendedResourceName": GPU,
            },
        })  # fmt: skip
        script = reporting("echo SIM_DEVICES=$SIM_DEVICES", "echo NODE=`stat -c %t:%T /dev/simgpu`")
        cluster.create_pod(api_pod("legacy", script, limits={GPU: 1}))
        pod = cluster.wait_for_pod(
            "legacy", lambda p: bool(p and p["status"].get("phase") == "Running"), "running"
        )
        assert pod is not None and pod["spec"]["nodeName"] == NODE_NAME
        made = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        claim = cluster.request("GET", f"{CLAIMS}/{made}")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (GPU_DRIVER, NODE_NAME)
        seen = _report(cluster, "legacy")
        assert seen["SIM_DEVICES"] == result["device"] and seen["NODE"] == ZERO
        assert _dra_status(devshim)["kubelet"]["prepared_claims"] == 1
        assert (devshim.status() or {})["resources"][GPU]["dra_only"] is True
        spec = node.cdi_dir / f"devshim-{GPU_DRIVER}-{claim['metadata']['uid']}.json"
        cluster.delete_pod("legacy")
        cluster.wait_for_pod("legacy", lambda p: p is None, "deleted by the kubelet once stopped")
        wait_until(lambda: not spec.exists(), "the kubelet unprepared the scheduler's claim")


@pytest.mark.full_matrix
def test_a_device_plugin_pod_gets_the_cdi_device_its_driver_ships(cluster: ConnectedNode) -> None:
    """The device-plugin path with CDI (issue 44, item 1): the sim as a driver whose grant is a
    CDI name alone and who ships that name's spec (protocol 1.2); devshim writes the spec into
    the node's CDI folder, the scheduler places a pod asking for `example.com/fpga: 1`, the real
    kubelet's Allocate hands containerd the CDI name (no env, no device node of its own), and
    containerd 2.x resolves it from devshim's file: the container sees the spec's env and node."""
    node = cluster.node
    sim = {
        "name": FPGA,
        "count": 1,
        "id_prefix": "fpga-",
        "grant": {"cdi_devices": [f"{FPGA}={{id}}"]},
        "cdi_spec": {"kind": FPGA, "edits": {
            "envs": {"FPGA": "{ids}"},
            "device_nodes": [{"container_path": "/dev/fpga", "host_path": "/dev/zero"}],
        }},
    }  # fmt: skip
    policy = {"envs": ["FPGA"], "device_nodes": ["/dev/zero"], "cdi_kinds": [FPGA]}
    driver = _sim_driver(node.folder, "fpga", sim, policy)
    with Devshim(node, {"drivers": [driver], "cdi_dir": str(node.cdi_dir)}):
        shipped = node.cdi_dir / "devshim-driver-fpga@example.com+fpga.json"
        wait_until(lambda: shipped.is_file(), "devshim wrote the spec the driver ships")
        script = reporting("echo FPGA=$FPGA", "echo NODE=`stat -c %t:%T /dev/fpga`")
        cluster.create_pod(api_pod("fpga", script, limits={FPGA: 1}))
        pod = cluster.wait_for_pod(
            "fpga", lambda p: bool(p and p["status"].get("phase") == "Running"), "running"
        )
        assert pod is not None and pod["spec"]["nodeName"] == NODE_NAME
        seen = _report(cluster, "fpga")
        assert seen["FPGA"] == "fpga-0" and seen["NODE"] == ZERO


def _running(pod: dict[str, Any] | None) -> bool:
    return bool(pod and pod["status"].get("phase") == "Running")


def _health_in_status(pod: dict[str, Any] | None, name: str) -> dict[str, str]:
    """The pod's first container's allocatedResourcesStatus entry ``name``: resource ID -> health."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    for entry in statuses[0].get("allocatedResourcesStatus") or []:
        if entry["name"] == name:
            return {r["resourceID"]: r["health"] for r in entry.get("resources") or []}
    return {}


def _flip_until_seen(cluster: ConnectedNode, control: Path, pod: str, name: str, device: str) -> None:
    """The sim marks ``device`` Unhealthy, then Healthy again; each time the pod's status must
    show it under ``name`` (ResourceHealthStatus, beta and on since 1.36)."""
    for health in ("Unhealthy", "Healthy"):
        with control.open("a") as commands:
            commands.write(f"health {GPU} {device} {health}\n")

        def shows(p: dict[str, Any] | None, want: str = health) -> bool:
            return want in _health_in_status(p, name).values()

        cluster.wait_for_pod(pod, shows, f"its status shows {name} {health}")


@pytest.mark.full_matrix
def test_a_device_plugin_devices_health_reaches_the_pods_status(cluster: ConnectedNode) -> None:
    """Issue 44, item 2, the device-plugin path: the kubelet (ResourceHealthStatus) puts the
    health devshim lists for a pod's device into status.containerStatuses[].allocatedResourcesStatus:
    the driver marks it Unhealthy, the pod's status says so, and back."""
    node = cluster.node
    control = node.folder / "sim.ctl"
    control.touch()
    sim = {"name": GPU, "count": 1, "id_prefix": "gpu-", "grant": {"envs": {"SIM_DEVICES": "{ids}"}}}
    driver = _sim_driver(node.folder, "sim", sim, {"envs": ["SIM_DEVICES"]}, control)
    with Devshim(node, {"drivers": [driver]}):
        cluster.create_pod(api_pod("watched", "exec sleep infinity", limits={GPU: 1}))

        def running_healthy(p: dict[str, Any] | None) -> bool:
            return _running(p) and _health_in_status(p, GPU) == {"gpu-0": "Healthy"}

        cluster.wait_for_pod("watched", running_healthy, "running, its device Healthy")
        _flip_until_seen(cluster, control, "watched", GPU, "gpu-0")


@pytest.mark.full_matrix
def test_a_dra_devices_health_reaches_the_pods_status(cluster: ConnectedNode) -> None:
    """Issue 44, item 2, DRA: devshim reports the pool's health through DRAResourceHealth; the
    kubelet puts it into the pod's status under claim:<the pod's name for it>, keyed by the device's
    CDI ID: the driver marks the allocated device Unhealthy, the pod's status says so, and back."""
    control = cluster.node.folder / "sim.ctl"
    control.touch()
    settings = _devshim_settings(cluster, control)
    with Devshim(cluster.node, settings) as devshim:
        pool = Published(cluster.plane, "v1", NODE_NAME)
        wait_until(lambda: (found := pool.pool()) is not None and len(found) == 2, "devshim published 2 GPUs")
        wait_until(lambda: _dra_status(devshim).get("kubelet", {}).get("registered"),
                   "the kubelet's plugin watcher registered devshim's DRA plugin")  # fmt: skip
        _device_class(cluster)
        _claim(cluster, "watched-gpu", count=1)
        cluster.create_pod(api_pod("watched", "exec sleep infinity", claims={"gpu": "watched-gpu"}))
        name = "claim:gpu"  # the pod's claim (claim:<name>/<request> where the container names one)
        pod = cluster.wait_for_pod(
            "watched", lambda p: _running(p) and "Healthy" in _health_in_status(p, name).values(), "Healthy"
        )
        claim = cluster.request("GET", f"{CLAIMS}/watched-gpu")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        [resource_id] = _health_in_status(pod, name)
        assert resource_id.startswith(f"{GPU_DRIVER}/claim="), resource_id  # the device's CDI ID
        _flip_until_seen(cluster, control, "watched", name, result["device"])


def _unschedulable(pod: dict[str, Any] | None) -> bool:
    conditions = (pod or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


@pytest.mark.full_matrix
def test_a_tainted_device_gets_no_new_claim_until_the_driver_clears_it(cluster: ConnectedNode) -> None:
    """Issue 44, item 3, device taints (protocol 1.3) with the real kube-scheduler: the driver
    taints gpu-0 NoSchedule, devshim publishes it, and the scheduler gives the first claim gpu-1
    and leaves a second claim's pod Pending (gpu-1 taken, gpu-0 tainted); the driver clears the
    taint and the waiting pod gets gpu-0."""
    control = cluster.node.folder / "sim.ctl"
    control.touch()
    with Devshim(cluster.node, _devshim_settings(cluster, control)) as devshim:
        pool = Published(cluster.plane, "v1", NODE_NAME)
        wait_until(lambda: (found := pool.pool()) is not None and len(found) == 2, "devshim published 2 GPUs")
        with control.open("a") as commands:
            commands.write(f"taint {GPU} gpu-0 gpu.example.com/ecc-errors NoSchedule\n")
        wait_until(lambda: ((pool.pool() or {}).get("gpu-0") or {}).get("taints"), "gpu-0's taint published")
        wait_until(lambda: _dra_status(devshim).get("kubelet", {}).get("registered"),
                   "the kubelet's plugin watcher registered devshim's DRA plugin")  # fmt: skip
        _device_class(cluster)
        _claim(cluster, "first", count=1)
        cluster.create_pod(api_pod("first", "exec sleep infinity", claims={"gpu": "first"}))
        cluster.wait_for_pod("first", _running, "running")
        [result] = cluster.request("GET", f"{CLAIMS}/first")["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-1"  # never the tainted gpu-0

        _claim(cluster, "second", count=1)
        cluster.create_pod(api_pod("second", "exec sleep infinity", claims={"gpu": "second"}))
        cluster.wait_for_pod("second", _unschedulable, "unschedulable: gpu-1 taken, gpu-0 tainted")
        assert "allocation" not in cluster.request("GET", f"{CLAIMS}/second").get("status", {})

        with control.open("a") as commands:
            commands.write(f"untaint {GPU} gpu-0\n")
        cluster.wait_for_pod("second", _running, "running once gpu-0's taint is gone")
        [result] = cluster.request("GET", f"{CLAIMS}/second")["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-0"


@pytest.mark.full_matrix
def test_an_admin_claim_gets_the_device_an_exclusive_claim_holds_and_leaves_it_held(
    cluster: ConnectedNode,
) -> None:
    """Issue 44, item 3, admin access (GA 1.36) with the real kube-scheduler: the node's one GPU is
    an exclusive claim's pod's; an admin-access claim in a namespace labelled for it is allocated
    the same GPU by the scheduler, prepared by devshim beside the first (protocol 1.3), and its
    pod runs with the grant; deleting it leaves the owner's claim prepared."""
    node = cluster.node
    sim = {"name": GPU, "count": 1, "admin_access": True, "grant": {"envs": {"SIM_DEVICES": "{ids}"}}}
    settings = _devshim_settings(cluster)  # its sim, replaced by one GPU that serves admin access:
    settings["drivers"] = [_sim_driver(node.folder, "admin-sim", sim, {"envs": ["SIM_DEVICES"]})]
    namespace = cluster.request("GET", "/api/v1/namespaces/default")
    namespace["metadata"].setdefault("labels", {})["resource.kubernetes.io/admin-access"] = "true"
    cluster.request("PUT", "/api/v1/namespaces/default", namespace)
    with Devshim(node, settings) as devshim:
        pool = Published(cluster.plane, "v1", NODE_NAME)
        wait_until(lambda: (found := pool.pool()) is not None and len(found) == 1, "devshim published gpu-0")
        wait_until(lambda: _dra_status(devshim).get("kubelet", {}).get("registered"),
                   "the kubelet's plugin watcher registered devshim's DRA plugin")  # fmt: skip
        _device_class(cluster)
        _claim(cluster, "owner", count=1)
        cluster.create_pod(api_pod("owner", "exec sleep infinity", claims={"gpu": "owner"}))
        cluster.wait_for_pod("owner", _running, "running")

        request = {"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER, "count": 1, "adminAccess": True}}
        cluster.request(
            "POST", CLAIMS, {"metadata": {"name": "watcher"}, "spec": {"devices": {"requests": [request]}}}
        )
        script = reporting("echo SIM_DEVICES=$SIM_DEVICES")
        cluster.create_pod(api_pod("watcher", script, claims={"gpu": "watcher"}))
        cluster.wait_for_pod("watcher", _running, "running beside the owner")
        [result] = cluster.request("GET", f"{CLAIMS}/watcher")["status"]["allocation"]["devices"]["results"]
        assert (result["device"], result.get("adminAccess")) == ("gpu-0", True)
        assert _report(cluster, "watcher")["SIM_DEVICES"] == "gpu-0"
        assert _dra_status(devshim)["kubelet"]["prepared_claims"] == 2

        cluster.delete_pod("watcher")
        cluster.wait_for_pod("watcher", lambda p: p is None, "deleted by the kubelet once stopped")
        wait_until(
            lambda: _dra_status(devshim)["kubelet"]["prepared_claims"] == 1, "the admin claim unprepared"
        )
        held = (devshim.status() or {})["resources"][GPU]["held"]
        assert held["dra"] == ["gpu-0"], held  # still the owner's
        assert _running(cluster.request("GET", "/api/v1/namespaces/default/pods/owner"))


@pytest.mark.full_matrix
def test_a_pod_gets_a_partition_and_the_whole_device_is_counted(cluster: ConnectedNode) -> None:
    """Issue 44, item 3, partitionable devices (protocol 1.3, 1.36's shape) with the real
    kube-scheduler: the sim serves gpu-0 (bringing the counter set gpu-0, 80Gi and 7 slices, and
    taking all of it) and its halves (40Gi and 3 slices each). A pod's claim for a half runs; a claim
    for the whole GPU cannot be allocated while that half is taken; a claim for the other half can."""
    whole, half = {"memory": "80Gi", "slices": "7"}, {"memory": "40Gi", "slices": "3"}

    def kind(k: str) -> dict[str, Any]:
        return {"kind": {"string": k}}

    sim = {
        "name": GPU,
        "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
        "devices": [
            {"id": "gpu-0", "attributes": kind("whole"),
             "counter_sets": [{"name": "gpu-0", "counters": whole}],
             "consumes_counters": [{"counter_set": "gpu-0", "counters": whole}]},
            *({"id": f"gpu-0-{p}", "attributes": kind("half"),
               "consumes_counters": [{"counter_set": "gpu-0", "counters": half}]} for p in "ab"),
        ],
    }  # fmt: skip
    settings = _devshim_settings(cluster)
    settings["drivers"] = [_sim_driver(cluster.node.folder, "mig-sim", sim, {"envs": ["SIM_DEVICES"]})]
    with Devshim(cluster.node, settings) as devshim:
        pool = Published(cluster.plane, "v1", NODE_NAME)
        wait_until(
            lambda: (found := pool.pool()) is not None and len(found) == 3, "the GPU and its halves published"
        )
        wait_until(lambda: _dra_status(devshim).get("kubelet", {}).get("registered"),
                   "the kubelet's plugin watcher registered devshim's DRA plugin")  # fmt: skip
        _device_class(cluster)

        def claim(name: str, which: str) -> None:
            selector = {"cel": {"expression": f'device.attributes["{GPU_DRIVER}"].kind == "{which}"'}}
            request = {
                "name": "gpu",
                "exactly": {"deviceClassName": GPU_DRIVER, "count": 1, "selectors": [selector]},
            }
            cluster.request(
                "POST", CLAIMS, {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}
            )
            cluster.create_pod(api_pod(name, "exec sleep infinity", claims={"gpu": name}))

        def allocated(name: str) -> str:
            [result] = cluster.request("GET", f"{CLAIMS}/{name}")["status"]["allocation"]["devices"][
                "results"
            ]
            return str(result["device"])

        claim("half-1", "half")
        cluster.wait_for_pod("half-1", _running, "running on a half")
        first = allocated("half-1")
        assert first in ("gpu-0-a", "gpu-0-b")
        claim("whole", "whole")
        cluster.wait_for_pod("whole", _unschedulable, "unschedulable: a half of gpu-0's counters is taken")
        claim("half-2", "half")
        cluster.wait_for_pod("half-2", _running, "running on the other half")
        assert {first, allocated("half-2")} == {"gpu-0-a", "gpu-0-b"}
        assert _dra_status(devshim)["kubelet"]["prepared_claims"] == 2


@pytest.mark.full_matrix
def test_two_pods_share_one_devices_capacity_and_a_third_waits(cluster: ConnectedNode) -> None:
    """Issue 44, item 3, consumable capacity (protocol 1.3: allow_multiple_allocations, shares;
    beta and on in 1.36) with the real kube-scheduler and kubelet: gpu-0 has 16Gi of memory and
    allows multiple allocations; two pods' claims for 8Gi each both get gpu-0, each its own
    share (devshim answers the kubelet each share's ID), and a third claim for 8Gi cannot be
    allocated. (Freeing a share needs the resourceclaim controller, which this node does not run.)"""
    sim = {
        "name": GPU,
        "shares": True,
        "capacity": {"memory": "16Gi"},
        "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
        "devices": [{"id": "gpu-0", "allow_multiple_allocations": True}],
    }
    settings = _devshim_settings(cluster)
    settings["drivers"] = [_sim_driver(cluster.node.folder, "share-sim", sim, {"envs": ["SIM_DEVICES"]})]
    with Devshim(cluster.node, settings) as devshim:
        pool = Published(cluster.plane, "v1", NODE_NAME)
        wait_until(lambda: (found := pool.pool()) is not None and len(found) == 1, "gpu-0 published")
        wait_until(lambda: _dra_status(devshim).get("kubelet", {}).get("registered"),
                   "the kubelet's plugin watcher registered devshim's DRA plugin")  # fmt: skip
        _device_class(cluster)

        def claim(name: str) -> None:
            exactly = {"deviceClassName": GPU_DRIVER, "count": 1, "capacity": {"requests": {"memory": "8Gi"}}}
            spec = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
            cluster.request("POST", CLAIMS, {"metadata": {"name": name}, "spec": spec})
            cluster.create_pod(api_pod(name, "exec sleep infinity", claims={"gpu": name}))

        shares = []
        for name in ("share-1", "share-2"):
            claim(name)
            cluster.wait_for_pod(name, _running, "running on a share of gpu-0")
            [result] = cluster.request("GET", f"{CLAIMS}/{name}")["status"]["allocation"]["devices"][
                "results"
            ]
            assert result["device"] == "gpu-0" and result["consumedCapacity"] == {"memory": "8Gi"}
            shares.append(result["shareID"])
        assert len(set(shares)) == 2
        claim("share-3")
        cluster.wait_for_pod("share-3", _unschedulable, "unschedulable: gpu-0's memory is all taken")
        assert _dra_status(devshim)["kubelet"]["prepared_claims"] == 2
        held = (devshim.status() or {})["resources"][GPU]["held"]
        assert held["dra"] == ["gpu-0"], held  # by both shares


def test_a_pod_binds_once_devshim_writes_its_devices_binding_conditions(cluster: ConnectedNode) -> None:
    """Issue 44, item 3, binding conditions (protocol 1.4; beta and on in 1.36) with the real
    kube-scheduler: gpu-0 needs an attach step; the scheduler allocates it, copies its conditions
    into the claim and waits before binding the pod; devshim asks the sim's attach and writes
    gpu.example.com/attached True into the claim's status; the scheduler binds the pod, and it runs."""
    attached, failed = "gpu.example.com/attached", "gpu.example.com/attach-failed"
    binding = {"conditions": [attached], "failure_conditions": [failed], "binds_to_node": True}
    sim = {
        "name": GPU,
        "attach": True,
        "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
        "devices": [{"id": "gpu-0", "binding": binding}],
    }
    settings = _devshim_settings(cluster)
    settings["drivers"] = [_sim_driver(cluster.node.folder, "attach-sim", sim, {"envs": ["SIM_DEVICES"]})]
    settings["dra"]["drivers"][0]["binding_conditions"] = True
    with Devshim(cluster.node, settings) as devshim:
        pool = Published(cluster.plane, "v1", NODE_NAME)
        wait_until(lambda: ((pool.pool() or {}).get("gpu-0") or {}).get("bindingConditions"),
                   "gpu-0 published with its binding conditions")  # fmt: skip
        wait_until(lambda: _dra_status(devshim).get("kubelet", {}).get("registered"),
                   "the kubelet's plugin watcher registered devshim's DRA plugin")  # fmt: skip
        _device_class(cluster)
        _claim(cluster, "attached", count=1)
        cluster.create_pod(api_pod("attached", "exec sleep infinity", claims={"gpu": "attached"}))
        pod = cluster.wait_for_pod("attached", _running, "running once its device was attached")
        assert pod is not None and pod["spec"]["nodeName"] == NODE_NAME
        status = cluster.request("GET", f"{CLAIMS}/attached")["status"]
        [result] = status["allocation"]["devices"]["results"]
        assert result["bindingConditions"] == [attached] and result["bindingFailureConditions"] == [failed]
        [entry] = status["devices"]
        assert (entry["driver"], entry["pool"], entry["device"]) == (GPU_DRIVER, NODE_NAME, "gpu-0")
        assert [(c["type"], c["status"]) for c in entry["conditions"]] == [(attached, "True")]
        assert _dra_status(devshim)["binding"]["attached"] == 1


# -- the pure parts, in every run ------------------------------------------------------------------

_CDI_RUNTIME = containerd.Runtime("/c/containerd", "/c/shim", "/c/ctr", "v2.4.2", cdi=True)


def test_containerd_2s_configuration_reads_cdi_specs_from_the_nodes_folder_only(tmp_path: Path) -> None:
    conf = tomllib.loads(containerd.config(tmp_path, _CDI_RUNTIME, [tmp_path / "cdi"]))
    assert conf["version"] == 3
    assert conf["grpc"]["address"] == str(containerd.socket(tmp_path))
    plugins = conf["plugins"]
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == [str(tmp_path / "cdi")] and "enable_cdi" not in runtime
    assert runtime["restrict_oom_score_adj"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert (runc["runtime_type"], runc["runtime_path"]) == ("io.containerd.runc.v2", "/c/shim")
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == images.PAUSE_IMAGE
    assert plugins["io.containerd.internal.v1.opt"]["path"].startswith(str(tmp_path))
    assert containerd.import_command(tmp_path, tmp_path / "a.tar", _CDI_RUNTIME)[0] == "/c/ctr"
    # The machine's containerd 1.6 keeps its format-2 configuration, without CDI.
    system = tomllib.loads(containerd.config(tmp_path))
    assert system["version"] == 2 and "cdi_spec_dirs" not in json.dumps(system)


def test_the_containerd_module_builds_the_programs_the_node_runs() -> None:
    """judges/containerd-2.N: go.mod's tool lines are exactly the programs built."""
    [module] = upstream.containerds()[-1:]
    assert module.version.startswith("v2.")
    gomod = (module.folder / "go.mod").read_text()
    tools = set(re.findall(r"github\.com/containerd/containerd/v2/cmd/([\w-]+)", gomod))
    assert tools == set(upstream.CONTAINERD_PROGRAMS)


def test_the_connected_kubelet_and_the_scheduler_are_given_the_api_server(tmp_path: Path) -> None:
    assert f"--kubeconfig={tmp_path / 'k'}" in kubelet.command(Path("/k"), tmp_path, tmp_path / "k")
    assert not [a for a in kubelet.command(Path("/k"), tmp_path) if a.startswith("--kubeconfig")]
    conf = scheduler.config(tmp_path / "admin")
    assert conf["clientConnection"]["kubeconfig"] == str(tmp_path / "admin")
    assert conf["leaderElection"]["leaderElect"] is False
    argv = scheduler.command(Path("/s"), tmp_path / "s.json", tmp_path / "admin", 1234)
    assert {f"--config={tmp_path / 's.json'}", "--secure-port=1234", "--bind-address=127.0.0.1"} <= set(argv)


def test_an_api_pod_names_its_claims_mounts_no_token_and_tolerates_the_not_ready_node() -> None:
    pod = api_pod("gpu", "true", claims={"gpu": "one-gpu"})
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["hostNetwork"] is True
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "one-gpu"}]
    assert spec["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
    assert {"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert "resourceClaims" not in api_pod("plain", "true")["spec"]

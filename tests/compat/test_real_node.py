"""A real node: the upstream kubelet (whole, standalone) and containerd run pods that request
devshim's resources, and each container reports what it was given (shim.compat.realnode).

Every test starts its own node (about 2 s) and devshim in front of it as a real process, with the
static source, the sim, devfs, or the legacy adapter in front of the Go legacy plugin. What is
checked is what the kubelet and the runtime did: the container's own view of its env, device
nodes and mounts, the kubelet's pod status (/pods of its read-only API), its PodResources API and
its checkpoint. By default the newest release with a kubelet runs; --full-matrix runs each.
Needs root, containerd and runc (Debian's), and Go to build the kubelet (minutes cold, once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import Node, NodeUnavailable, pod_manifest
from shim.compat.upstream import releases as upstream
from tests.support.devshim_process import runs
from tests.support.real_node import (
    DEFAULT,
    KUBELETS,
    Devshim,
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

GPU, FULL, GOPLUG, STATIC = "example.com/gpu", "example.com/full", "example.com/goplug", "example.com/static"
PYTHON = sys.executable
MARKER = "granted-mount"
# A container's report of a device node: its major and minor numbers, in hex as stat prints them.
ZERO, FULL_NODE, NULL = "1:5", "1:7", "1:3"


# The rows issue 42 asks of every run at both ends of the supported range, not only the newest.
BOTH_ENDS = (KUBELETS[0], KUBELETS[-1])


def _param(release: upstream.Release, default: Sequence[upstream.Release] = DEFAULT) -> Any:
    marks = () if release in default else (pytest.mark.full_matrix,)
    return pytest.param(release, marks=marks, id=release.name)


@pytest.fixture(scope="session")
def kubelets() -> dict[upstream.Release, Path]:
    """The kubelet binaries, built (or found in the judge's cache) once per session."""
    check_machine()
    return {}


@pytest.fixture(params=[_param(r) for r in KUBELETS])
def node(request: pytest.FixtureRequest, kubelets: dict[upstream.Release, Path]) -> Iterator[Node]:
    """A node of its own for each test, stopped (everything killed and unmounted) afterwards."""
    release: upstream.Release = request.param
    if release not in kubelets:
        kubelets[release] = upstream.build(release, program=upstream.KUBELET_PROGRAM, log=False)
    with one_node_at_a_time(), short_temp_dir("ds-node-") as folder:
        node = Node(folder, kubelets[release], release.minor)
        try:
            try:
                node.start()
            except NodeUnavailable as missing:  # what check_machine cannot see: cgroups, namespaces
                unavailable(str(missing))
            share = folder / "share"
            share.mkdir()
            (share / "marker").write_text(MARKER)
            yield node
        finally:
            node.stop()


def _share(node: Node) -> str:
    return str(node.folder / "share")


def _share_policy(node: Node, **allowed: list[str]) -> dict[str, Any]:
    """A policy allowing the share's read-only mount and ``allowed`` (envs, device_nodes, ...)."""
    # The share lies in the node's temp folder, below /tmp, which anyone may write to.
    return {"mounts": [_share(node)], "allow_world_writable_dirs": True, **allowed}


def _sim(
    node: Node, restart: dict[str, Any] | None = None, wrapper: Sequence[str] = (), calls: bool = False
) -> dict[str, Any]:
    """devshim's driver entry for the sim serving two GPUs, each grant an env, /dev/zero and the
    share; with `calls`, the sim also asks for PreStartContainer and deallocate."""
    config = node.folder / "sim.json"
    config.write_text(json.dumps({"resources": [{
        "name": GPU,
        "count": 2,
        "prestart": calls,
        "deallocate": calls,
        "grant": {
            "envs": {"SIM_DEVICES": "{ids}"},
            "device_nodes": [{"container_path": "/dev/simgpu", "host_path": "/dev/zero"}],
            "mounts": [{"container_path": "/granted", "host_path": _share(node), "read_only": True}],
        },
    }]}))  # fmt: skip
    driver: dict[str, Any] = {
        "name": "sim",
        "user": "root",
        "command": [*wrapper, PYTHON, "-m", "devshim_adapters.sim", "--config", str(config)],
        "resources": [GPU],
        "policy": _share_policy(node, envs=["SIM_DEVICES"], device_nodes=["/dev/zero"]),
    }
    if restart:
        driver["restart"] = restart
    return {"drivers": [driver]}


_GRANT_REPORT = (
    "echo NODE=`stat -c %t:%T /dev/granted`",
    "echo MOUNT=`cat /granted/marker`",
    "(echo x > /granted/written) 2>/dev/null && echo MOUNT_WRITE=allowed || echo MOUNT_WRITE=refused",
)


def _held(node: Node, pod: str, resource: str) -> list[str]:
    """The device IDs the kubelet's PodResources API says the pod's container holds."""
    for listed in kubelet_pods(node):
        if listed.name == f"{pod}-devshim-node":
            return [d.id for d in listed.container("main").devices if d.resource == resource]
    raise AssertionError(f"PodResources lists no pod {pod}")


def _checkpointed(node: Node, resource: str) -> tuple[set[str], set[str]]:
    """From the kubelet's own checkpoint: the devices allocated to pods, and those registered."""
    data = json.loads(node.checkpoint.read_text())["Data"]
    allocated = {
        device
        for entry in data["PodDeviceEntries"] or []
        if entry["ResourceName"] == resource
        for ids in entry["DeviceIDs"].values()
        for device in ids
    }
    return allocated, set((data.get("RegisteredDevices") or {}).get(resource) or [])


def _admitted(node: Node, name: str, resource: str, script: str) -> dict[str, str]:
    node.run_pod(pod_manifest(name, script, {resource: 1}))
    node.wait_for_pod(name, running, "running")
    return report(node, name)


@pytest.mark.timeout(upstream.BUILD_TIMEOUT_S * 2)
def test_the_kubelets_build(kubelets: dict[upstream.Release, Path], request: pytest.FixtureRequest) -> None:
    """First, so a cold build (minutes) has its own timeout: each release's kubelet runs."""
    full = request.config.getoption("--full-matrix")
    chosen = [r for r in KUBELETS if full or r in DEFAULT or r in BOTH_ENDS]
    for release in chosen:
        binary = kubelets.setdefault(
            release, upstream.build(release, program=upstream.KUBELET_PROGRAM, log=False)
        )
        assert binary.is_file() and os.access(binary, os.X_OK), release.name


def test_a_pod_sees_the_sims_grant(node: Node) -> None:
    """The sim's grant (env, device node, read-only mount) is what the container sees, for the
    device the kubelet's PodResources and checkpoint say it holds."""
    with Devshim(node, _sim(node)) as devshim:
        assert devshim.registered(GPU)["negotiated"] == "v1beta1"
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the kubelet lists two healthy GPUs")
        seen = _admitted(node, "gpu", GPU, reporting("echo SIM_DEVICES=$SIM_DEVICES", *_GRANT_REPORT).replace(
            "/dev/granted", "/dev/simgpu"))  # fmt: skip
        held = _held(node, "gpu", GPU)
        assert len(held) == 1 and seen["SIM_DEVICES"] == held[0]
        assert (seen["NODE"], seen["MOUNT"], seen["MOUNT_WRITE"]) == (ZERO, MARKER, "refused")
        # The kubelet's checkpoint agrees with PodResources once it is written: waited for, as
        # the kubelet writes it in its own time (one CI run read it empty just after the pod ran).
        wait_until(lambda: _checkpointed(node, GPU)[0] == set(held), "the checkpoint names the held device")
        allocated, registered = _checkpointed(node, GPU)
        assert allocated == set(held) and len(registered) == 2


def test_the_kubelets_plugin_watcher_registers_devshim(node: Node) -> None:
    """Watcher registration: the kubelet's plugin manager finds devshim's socket in its own
    plugins_registry, registers it, and a pod gets the grant."""
    with Devshim(node, {**_sim(node), "registration": "watcher"}) as devshim:
        entry = devshim.registered(GPU)
        assert entry["socket"].startswith(str(node.plugins_registry_dir))  # the kubelet's own, by root dir
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the kubelet lists two healthy GPUs")
        seen = _admitted(node, "gpu", GPU, reporting("echo SIM_DEVICES=$SIM_DEVICES"))
        assert [seen["SIM_DEVICES"]] == _held(node, "gpu", GPU)


def test_prestart_and_deallocate_reach_the_driver(node: Node) -> None:
    """The real kubelet calls PreStartContainer once for the container, and once the pod is gone from
    its PodResources List, devshim's deallocate emulation tells the driver, once."""
    fast = {"deallocation": {"pod_resources_socket": str(node.pod_resources_socket), "poll_interval_s": 0.2,
                             "grace_s": 0}}  # fmt: skip
    with Devshim(node, {**_sim(node, calls=True), **fast}) as devshim:
        devshim.registered(GPU)
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the kubelet lists two healthy GPUs")
        _admitted(node, "gpu", GPU, reporting("echo SIM_DEVICES=$SIM_DEVICES"))

        def calls() -> dict[str, Any]:
            return dict(((devshim.status() or {}).get("drivers") or {}).get("sim", {}).get("calls") or {})

        assert calls()["prestart"] == {"ok": 1, "failed": 0, "last_error": None}
        assert "deallocate" not in calls()
        node.remove_pod("gpu")
        wait_until(lambda: "deallocate" in calls(), "the driver was told to deallocate")
        wait_until(lambda: "gpu" not in node.pods(), "the kubelet forgot the pod")
        assert calls()["deallocate"] == {"ok": 1, "failed": 0, "last_error": None}


def test_a_pod_sees_the_static_resources_grant(node: Node) -> None:
    """A static resource (no driver): env, device node and mount reach the container."""
    settings = {"resources": [{
        "name": STATIC,
        "static": {"count": 2, "id_prefix": "s", "grant": {
            "envs": {"STATIC_IDS": "{ids}"},
            "device_nodes": [{"container_path": "/dev/granted", "host_path": "/dev/zero"}],
            "mounts": [{"container_path": "/granted", "host_path": _share(node), "read_only": True}],
        }},
        "policy": _share_policy(node, envs=["STATIC_IDS"], device_nodes=["/dev/zero"]),
    }]}  # fmt: skip
    with Devshim(node, settings) as devshim:
        devshim.registered(STATIC)
        wait_until(lambda: allocatable_ids(node, STATIC) == {"s0", "s1"}, "the kubelet lists s0 and s1")
        seen = _admitted(node, "static", STATIC, reporting("echo STATIC_IDS=$STATIC_IDS", *_GRANT_REPORT))
        assert [seen["STATIC_IDS"]] == _held(node, "static", STATIC)
        assert (seen["NODE"], seen["MOUNT"], seen["MOUNT_WRITE"]) == (ZERO, MARKER, "refused")


def test_a_pod_sees_the_devfs_node(node: Node) -> None:
    """devfs serving /dev/full: the container has the node (as devfs names it) and the mount."""
    config = node.folder / "devfs.json"
    config.write_text(json.dumps({"groups": [{
        "resource": FULL, "paths": ["/dev/full"], "container_path": "/dev/granted",
        "mounts": [{"container_path": "/granted", "host_path": _share(node), "read_only": True}],
    }]}))  # fmt: skip
    driver = {
        "name": "devfs",
        "user": "root",
        "command": [PYTHON, "-m", "devshim_adapters.devfs", "--config", str(config)],
        "resources": [FULL],
        "policy": _share_policy(node, device_nodes=["/dev/full"]),
    }
    with Devshim(node, {"drivers": [driver]}) as devshim:
        devshim.registered(FULL)
        wait_until(lambda: allocatable_ids(node, FULL) == {"full"}, "the kubelet lists /dev/full")
        seen = _admitted(node, "full", FULL, reporting(*_GRANT_REPORT))
        assert _held(node, "full", FULL) == ["full"]
        assert (seen["NODE"], seen["MOUNT"], seen["MOUNT_WRITE"]) == (FULL_NODE, MARKER, "refused")


def test_a_pod_sees_the_legacy_plugins_grant(node: Node, goplug: Path) -> None:
    """The Go legacy plugin behind the legacy adapter: its Allocate answer (env and a device node
    per device) reaches the container through devshim and the kubelet."""
    with short_temp_dir("ds-priv-") as private:
        adapter = [PYTHON, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private)]
        adapter += ["--", str(goplug), "-dir", str(private), "-prestart"]
        # What the Go plugin grants: an env, /dev/null per device, and a CDI device of its own.
        allowed = {"envs": ["GOPLUG_DEVICES"], "device_nodes": ["/dev/null"], "cdi_kinds": [GOPLUG]}
        driver = {
            "name": "legacy",
            "user": "root",
            "command": adapter,
            "resources": [GOPLUG],
            "policy": allowed,
        }
        with Devshim(node, {"drivers": [driver]}) as devshim:
            devshim.registered(GOPLUG)
            wait_until(lambda: allocatable_ids(node, GOPLUG) == {"g0", "g1", "g2"}, "the kubelet lists g0-g2")
            script = reporting(
                "echo GOPLUG_DEVICES=$GOPLUG_DEVICES", "echo NODE=`stat -c %t:%T /dev/goplug/*`"
            )
            seen = _admitted(node, "legacy", GOPLUG, script)
            held = _held(node, "legacy", GOPLUG)
            assert [seen["GOPLUG_DEVICES"]] == held and seen["NODE"] == NULL


def test_more_devices_than_are_healthy_is_the_kubelets_refusal(node: Node) -> None:
    """A pod asking for three of two GPUs is rejected by the kubelet's own admission, in its words;
    a pod that fits is admitted after it."""
    with Devshim(node, _sim(node)) as devshim:
        devshim.registered(GPU)
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the kubelet lists two healthy GPUs")
        node.run_pod(pod_manifest("greedy", "sleep infinity", {GPU: 3}))
        status = node.wait_for_pod("greedy", lambda p: p["status"].get("phase") == "Failed", "rejected")[
            "status"
        ]
        assert status["reason"] == "UnexpectedAdmissionError"
        assert (
            f"requested number of devices unavailable for {GPU}. Requested: 3, Available: 2"
            in status["message"]
        )
        node.run_pod(pod_manifest("modest", "sleep infinity", {GPU: 2}))
        node.wait_for_pod("modest", running, "running")


def rejected(pod: dict[str, Any]) -> bool:
    return bool(pod["status"].get("phase") == "Failed")


def _container_id(node: Node, pod: str) -> str:
    return str(node.pods()[pod]["status"]["containerStatuses"][0]["containerID"])


@pytest.mark.parametrize("node", [_param(r, BOTH_ENDS) for r in KUBELETS], indirect=True)
def test_a_pod_started_after_devshim_restarts_gets_prestart(node: Node) -> None:
    """devshim stopped by SIGTERM (every upgrade) and started again with its state folder: the
    real kubelet, which reads a plugin's options once per registration, calls PreStartContainer for
    a pod started then (issue 42, item 1: it did not until the kubelet itself restarted)."""
    with Devshim(node, _sim(node, calls=True)) as devshim:
        devshim.registered(GPU)
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the kubelet lists two healthy GPUs")
        devshim.stop()
        wait_until(lambda: not allocatable_ids(node, GPU), "the kubelet saw devshim go")
        devshim.start()
        devshim.registered(GPU)
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the kubelet lists both GPUs again")
        _admitted(node, "after", GPU, reporting("echo SIM_DEVICES=$SIM_DEVICES"))
        calls = (((devshim.status() or {}).get("drivers") or {}).get("sim") or {}).get("calls") or {}
        assert calls.get("prestart") == {"ok": 1, "failed": 0, "last_error": None}


def test_pods_keep_their_devices_through_devshim_and_kubelet_restarts(node: Node) -> None:
    """devshim restarted, then the kubelet: the running pod's container is never restarted, devshim
    registers again each time, a new pod gets the other GPU, and once both are held the restarted
    kubelet refuses a third pod (it kept both allocations)."""
    script = reporting("echo SIM_DEVICES=$SIM_DEVICES")
    devshim = Devshim(node, _sim(node))
    with devshim:
        devshim.registered(GPU)
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the kubelet lists two healthy GPUs")
        first = _admitted(node, "first", GPU, script)["SIM_DEVICES"]
        container = _container_id(node, "first")
        devshim.stop()
        devshim.start()
        devshim.registered(GPU)
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the kubelet lists both GPUs again")
        second = _admitted(node, "second", GPU, script)["SIM_DEVICES"]
        assert {first, second} == allocatable_ids(node, GPU)
        node.restart_kubelet()
        devshim.registered(GPU)
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the restarted kubelet lists both GPUs")
        for pod in ("first", "second"):
            status = node.wait_for_pod(pod, running, "still running")["status"]["containerStatuses"][0]
            assert status["restartCount"] == 0
        assert _container_id(node, "first") == container
        node.run_pod(pod_manifest("third", "sleep infinity", {GPU: 1}))
        status = node.wait_for_pod("third", lambda p: p["status"].get("phase") == "Failed", "rejected")[
            "status"
        ]
        assert "Requested: 1, Available: 0" in status["message"]
        assert _checkpointed(node, GPU)[0] == {first, second}


def test_a_driver_crash_shows_its_devices_unhealthy_at_the_kubelet(node: Node) -> None:
    """The sim killed and unable to start again: the kubelet stops offering its devices (PodResources
    allocatable), keeps them registered (its checkpoint), reports the running pod's device
    Unhealthy in its status (1.31+, ResourceHealthStatus), and refuses a new pod. Once devshim can
    run the driver again, the devices are back."""
    flag = node.folder / "sim-may-start"
    flag.touch()
    wrapper = ["/bin/sh", "-c", 'test -e "$0" && exec "$@"', str(flag)]
    devshim = Devshim(node, _sim(node, restart={"max_start_failures": 1}, wrapper=wrapper))
    with devshim:
        devshim.registered(GPU)
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the kubelet lists two healthy GPUs")
        held = _admitted(node, "holder", GPU, reporting("echo SIM_DEVICES=$SIM_DEVICES"))["SIM_DEVICES"]
        flag.unlink()
        status = devshim.status()
        assert status is not None
        os.kill(status["drivers"]["sim"]["pid"], signal.SIGKILL)
        wait_until(lambda: not allocatable_ids(node, GPU), "the kubelet offers no GPU")
        # The checkpoint keeps the pod's allocation and lists only healthy devices as registered.
        wait_until(lambda: _checkpointed(node, GPU) == ({held}, set()), "the checkpoint lists no healthy GPU")
        if node.minor >= 31:

            def reported_unhealthy(pod: dict[str, Any]) -> bool:
                health = pod["status"]["containerStatuses"][0].get("allocatedResourcesStatus") or []
                return any(r.get("health") == "Unhealthy" and r.get("resourceID") == held
                           for entry in health for r in entry.get("resources", []))  # fmt: skip

            node.wait_for_pod("holder", reported_unhealthy, f"{held} reported Unhealthy in the pod's status")
        node.run_pod(pod_manifest("late", "sleep infinity", {GPU: 1}))
        status = node.wait_for_pod("late", lambda p: p["status"].get("phase") == "Failed", "rejected")[
            "status"
        ]
        assert f"no healthy devices present; cannot allocate unhealthy devices {GPU}" in status["message"]
        flag.touch()
        devshim.stop()
        devshim.start()
        wait_until(lambda: len(allocatable_ids(node, GPU)) == 2, "the GPUs are healthy again")


def test_v1beta2_offered_the_real_kubelet_takes_v1beta1(node: Node) -> None:
    """No kubelet release speaks v1beta2: offered it first, the real kubelet has no such service,
    devshim registers v1beta1 instead, and a pod gets its grant."""
    with Devshim(node, {**_sim(node), "api_versions": ["v1beta2", "v1beta1"]}) as devshim:
        assert devshim.registered(GPU)["negotiated"] == "v1beta1"
        # The kubelet has no v1beta2 Registration service at all: UNIMPLEMENTED, not its "version
        # is not supported" answer (that one is for a v1beta1 Register naming another version).
        assert f"{GPU}: the kubelet does not speak v1beta2; trying an older version" in devshim.output()
        assert "Bad registration" not in node.kubelet_log.read_text()
        seen = _admitted(node, "gpu", GPU, reporting("echo SIM_DEVICES=$SIM_DEVICES"))
        assert [seen["SIM_DEVICES"]] == _held(node, "gpu", GPU)


def _mounts_under(folder: Path) -> list[str]:
    """Mount points in this (the host's) mount namespace that lie in `folder`."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines if line.split()[4].startswith(str(folder))]


@pytest.mark.parametrize("release", [_param(r) for r in KUBELETS])
def test_a_failing_test_leaves_nothing_running_or_mounted(
    release: upstream.Release, kubelets: dict[upstream.Release, Path]
) -> None:
    """A test that fails with a pod running: every process the node ran (daemons, shims, the
    containers) is gone, its cgroups are removed in every hierarchy, and nothing is mounted."""
    binary = kubelets.get(release) or upstream.build(release, program=upstream.KUBELET_PROGRAM, log=False)
    with short_temp_dir("ds-node-") as folder:
        node = Node(folder, binary, release.minor)
        with pytest.raises(RuntimeError, match="a test failed"), node:
            node.run_pod(pod_manifest("busy", "sleep infinity & sleep infinity"))
            node.wait_for_pod("busy", running, "running")
            cgroup = node._host.cgroup
            pids = wait_until(lambda: p if len(p := cgroup.pids()) >= 6 else None, "the node's processes")
            raise RuntimeError("a test failed")
        assert not [pid for pid in pids if runs(pid)]
        assert not list(Path("/sys/fs/cgroup").glob(f"*/{cgroup.name}")), "cgroups left"
        assert not _mounts_under(folder) and not _mounts_under(Path("/run/containerd"))


def test_a_node_starts_by_hand_with_one_command() -> None:
    """`python -m shim.compat.realnode` builds (or finds) the kubelet, starts the node, says where its
    read-only API is, serves there, and on SIGINT stops, leaving nothing running."""
    check_machine()
    release = DEFAULT[0]
    upstream.build(release, program=upstream.KUBELET_PROGRAM, log=False)
    with short_temp_dir("ds-byhand-") as short:  # containerd's sockets must fit sun_path
        folder = short / "node"
        _start_a_node_by_hand(release, folder)


def _start_a_node_by_hand(release: upstream.Release, folder: Path) -> None:
    argv = [PYTHON, "-m", "shim.compat.realnode", "--release", f"1.{release.minor}", "--dir", str(folder)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as cli:
        assert cli.stdout is not None
        lines = [cli.stdout.readline() for _ in range(7)]
        assert lines[0].startswith("node up in ") and release.version in lines[0], lines
        url = next(line.split()[-1] for line in lines if "read-only API" in line)
        with urllib.request.urlopen(url, timeout=10) as response:
            assert json.load(response)["kind"] == "PodList"
        cli.send_signal(signal.SIGINT)
        assert cli.wait(60) == 0
    assert not (folder / "kubelet.log").read_text().count("panic")
    assert not [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(folder) in line]

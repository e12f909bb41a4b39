"""The kustomize manifests in deploy/: each kustomization rendered by `kubectl kustomize`, every
object validated offline (strict: unknown fields fail) against the Kubernetes schemas that
kubernetes-validate ships, and the properties devshim depends on asserted."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kr8s._auth import KubeAuth

from adapters.sim.config import load_config
from shim.settings import Settings
from tests.deploy.tools import DEPLOY, PROJECT, ROOT, require_tool

Doc = dict[str, Any]
NAMESPACE = "devshim-system"
IMAGE_VENV_BIN = "/opt/devshim/bin/"  # where the Dockerfile's venv puts the project's scripts
KUBELET_DIRS = (
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet/pod-resources",
)
# Every deployable kustomization: the base, each overlay and each example (a new one is tested
# unasked).
TARGETS = ["base"] + sorted(
    f"{kind}/{d.name}"
    for kind in ("overlays", "examples")
    for d in (DEPLOY / kind).iterdir()
    if (d / "kustomization.yaml").exists()
)


def uses_dra(target: str) -> bool:
    """Whether deploy/TARGET adds components/dra."""
    kustomization = yaml.safe_load((DEPLOY / target / "kustomization.yaml").read_text(encoding="utf-8"))
    return any(Path(c).name == "dra" for c in kustomization.get("components", []))


@cache
def render(directory: Path) -> tuple[Doc, ...]:
    kubectl = require_tool("kubectl")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def one(docs: tuple[Doc, ...], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def devshim_container(daemonset: Doc) -> Doc:
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "devshim")


def volumes(daemonset: Doc) -> dict[str, Doc]:
    return {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}


def mount_for(daemonset: Doc, path: Path) -> tuple[Doc, Doc]:
    """The devshim container's (mount, volume) holding PATH: the deepest mount above it."""
    mounts = [m for m in devshim_container(daemonset)["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    assert mounts, f"{path} is on no volume of the devshim container"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return mount, volumes(daemonset)[mount["name"]]


def assert_paths_on_host_volumes(daemonset: Doc, settings: Settings) -> None:
    """Every node path of ``settings`` is on a hostPath volume mounted at that same path,
    read-write where devshim writes; with DRA drivers, their kubelet plugin's too (the
    registration socket in plugins_registry_dir, the CDI specs in dra.cdi_dir; the checkpoint is in
    state_dir), each DRA socket's folder <dra.plugins_dir>/<driver> a volume of its own (made if
    missing), and the plugins directory itself on no volume at all (other drivers' sockets, CSI's
    staged volumes)."""
    paths = [
        (settings.device_plugins_dir, True),
        (settings.plugins_registry_dir, True),
        (settings.state_dir, True),
        (settings.deallocation.pod_resources_socket, False),
    ]
    if settings.dra.drivers:
        paths += [(settings.dra.cdi_dir, True)]
    for path, writes in paths:
        mount, volume = mount_for(daemonset, path)
        assert volume["hostPath"]["path"] == mount["mountPath"], path
        assert not (writes and mount.get("readOnly", False)), path
    assert_only_driver_folders_mounted(
        daemonset, settings.dra.plugins_dir, [d.name for d in settings.dra.drivers]
    )


def assert_only_driver_folders_mounted(daemonset: Doc, plugins_dir: Path, drivers: list[str]) -> None:
    """Under the kubelet's plugins directory the devshim container mounts exactly each driver's
    folder, read-write, from that host path (DirectoryOrCreate: the kubelet makes plugins/, not
    a driver's folder); no container mounts the directory itself or one above it."""
    mounted = {}
    for container in daemonset["spec"]["template"]["spec"]["containers"]:
        for mount in container.get("volumeMounts", []):
            path = Path(mount["mountPath"])
            assert not plugins_dir.is_relative_to(path), (
                f"{container['name']} mounts {path}, all of {plugins_dir}"
            )
            if path.is_relative_to(plugins_dir):
                assert container["name"] == "devshim", f"{container['name']} mounts {path}"
                mounted[path] = mount
    assert sorted(mounted) == sorted(plugins_dir / name for name in drivers)
    for path, mount in mounted.items():
        host = volumes(daemonset)[mount["name"]]["hostPath"]
        assert host == {"path": str(path), "type": "DirectoryOrCreate"} and not mount.get("readOnly"), path


def config_files(docs: tuple[Doc, ...], tmp_path: Path) -> tuple[Path, Doc]:
    """The DaemonSet's ConfigMap written out as files; returns the config's directory and the
    mount, so the paths the container sees can be mapped to the files."""
    daemonset = one(docs, "DaemonSet")
    args = devshim_container(daemonset)["args"]
    config_path = Path(args[args.index("--config") + 1])
    mount, volume = mount_for(daemonset, config_path)
    configmap = one(docs, "ConfigMap", volume["configMap"]["name"])
    # Each key as a file of its name, or where the volume's items put it (only those, then).
    paths = {i["key"]: i["path"] for i in volume["configMap"].get("items", ())} or {
        k: k for k in configmap["data"]
    }
    for key, path in paths.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(configmap["data"][key], encoding="utf-8")
    assert (tmp_path / config_path.relative_to(mount["mountPath"])).exists(), "--config names no key"
    return tmp_path, mount


def validate_strictly(doc: Doc, version: str) -> None:
    """Raise (SchemaNotFoundError) for a kind with no built-in schema; fail, in one line, on
    any schema violation, an unknown field included."""
    problem = None
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        problem = f"{'.'.join(str(part) for part in exc.path)}: {exc.message}"
    if problem:  # outside the except: the schema error's own repr runs to pages
        pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {problem}", pytrace=False)


@pytest.fixture
def no_devshim_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings read DEVSHIM_* variables too: check the shipped files alone. NODE_NAME is the
    pod's (the downward API's, with components/dra), which a config with DRA drivers needs."""
    for key in [k for k in os.environ if k.startswith("DEVSHIM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("NODE_NAME", "node-a")
    yield


@pytest.mark.parametrize("target", TARGETS)
def test_every_object_validates_strictly(target: str) -> None:
    version = kubernetes_validate.latest_version()
    docs = render(DEPLOY / target)
    dra = DRA_KINDS if uses_dra(target) else set()
    assert {d["kind"] for d in docs} == {"Namespace", "ConfigMap", "DaemonSet"} | dra
    for doc in docs:
        validate_strictly(doc, version)


@pytest.mark.parametrize("target", TARGETS)
def test_objects_are_labelled_and_namespaced(target: str) -> None:
    for doc in render(DEPLOY / target):
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/name") == "devshim", doc["metadata"]
        assert labels.get("app.kubernetes.io/version") == PROJECT["version"]
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == NAMESPACE
            # hostPath volumes are refused below the privileged Pod Security level.
            assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
        elif doc["kind"] in DRA_KINDS - {"ServiceAccount"}:
            assert "namespace" not in doc["metadata"]  # components/dra's cluster-scoped objects
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE
    daemonset = one(render(DEPLOY / target), "DaemonSet")
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "devshim", "app.kubernetes.io/instance": "devshim"}
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("target", TARGETS)
def test_daemonset_runs_on_every_node_and_hands_over_by_surge(target: str) -> None:
    daemonset = one(render(DEPLOY / target), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    # An Exists toleration without a key tolerates every taint.
    assert {"operator": "Exists"} in pod["tolerations"]
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    # Two pods of one node side by side during a surge: neither may claim a host port.
    assert not pod.get("hostNetwork")
    assert all("hostPort" not in p for c in pod["containers"] for p in c.get("ports", []))
    assert pod["terminationGracePeriodSeconds"] >= 30
    image = devshim_container(daemonset)["image"]
    # An example sets the image of its own (FROM devshim's, adding a driver); the rest run devshim's.
    own = (
        f"registry.example/devshim-vendor:{PROJECT['version']}"
        if target == "examples/vendor-driver"
        else None
    )
    assert image == (own or f"devshim:{PROJECT['version']}")


@pytest.mark.parametrize("target", TARGETS)
def test_probes_and_metrics_use_the_ops_port(target: str) -> None:
    daemonset = one(render(DEPLOY / target), "DaemonSet")
    container = devshim_container(daemonset)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    exposed = re.findall(r"^EXPOSE\s+(\d+)", (ROOT / "Dockerfile").read_text(encoding="utf-8"), re.M)
    assert ports["ops"] == 9477 and exposed == ["9477"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ops"}
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(ports["ops"])
    assert annotations["prometheus.io/path"] == "/metrics"
    resources = container["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys() and "memory" in resources["limits"]


@pytest.mark.parametrize("target", TARGETS)
def test_devshim_is_root_but_unprivileged_with_the_kubelet_dirs_mounted(target: str) -> None:
    daemonset = one(render(DEPLOY / target), "DaemonSet")
    container = devshim_container(daemonset)
    security = container["securityContext"]
    assert security.get("privileged", False) is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SETUID", "SETGID"]}
    assert security["readOnlyRootFilesystem"] is True
    for directory in KUBELET_DIRS:
        mount, volume = mount_for(daemonset, Path(directory))
        assert mount["mountPath"] == directory and volume["hostPath"]["path"] == directory
        # devshim creates sockets in the first two; the third it only connects to.
        assert mount.get("readOnly", False) is directory.endswith("pod-resources")
    # The grant policy judges device nodes as the host has them (docs/configuration.md).
    mount, volume = mount_for(daemonset, Path("/dev/nvidia0"))
    assert (mount["mountPath"], mount["readOnly"], volume["hostPath"]["path"]) == ("/dev", True, "/dev")
    assert_termination_log_mountable(daemonset)


def assert_termination_log_mountable(daemonset: Doc) -> None:
    """The kubelet mounts the termination log at terminationMessagePath (default
    /dev/termination-log): runc must create that mount point, which it cannot inside a read-only
    mount. The real node refused the read-only /dev this way (error mounting ... to rootfs at
    /dev/termination-log: read-only file system; tests/deploy/test_image_real_node.py)."""
    container = devshim_container(daemonset)
    path = Path(container.get("terminationMessagePath", "/dev/termination-log"))
    mount, _ = mount_for(daemonset, path)
    assert not mount.get("readOnly", False), f"{path} is under the read-only mount {mount['mountPath']}"


@pytest.mark.parametrize("target", TARGETS)
def test_shipped_config_loads_and_lies_on_the_host_paths(
    target: str, tmp_path: Path, no_devshim_env: None
) -> None:
    """The ConfigMap's config is valid Settings (strict: unknown keys fail), and every node
    path in it is on a hostPath volume mounted at that same path, read-write where devshim
    writes."""
    docs = render(DEPLOY / target)
    daemonset = one(docs, "DaemonSet")
    folder, config_mount = config_files(docs, tmp_path)
    settings = Settings.load(folder / "config.yaml")
    assert_paths_on_host_volumes(daemonset, settings)
    for driver in settings.drivers:
        # The shipped configs name the image's absolute paths, which must exist in the image.
        program = driver.command[0]
        if target == "examples/vendor-driver":  # its own image's interpreter (test_image_flow.py)
            assert program == "/usr/bin/node"
            continue
        assert program.startswith(IMAGE_VENV_BIN) and program[len(IMAGE_VENV_BIN) :] in PROJECT["scripts"]
        for arg in driver.command[1:]:
            if arg.startswith(config_mount["mountPath"] + "/"):
                assert (folder / Path(arg).relative_to(config_mount["mountPath"])).exists(), arg


def test_sim_demo_serves_four_simulated_devices(tmp_path: Path, no_devshim_env: None) -> None:
    docs = render(DEPLOY / "overlays" / "sim-demo")
    folder, mount = config_files(docs, tmp_path)
    (driver,) = Settings.load(folder / "config.yaml").drivers
    command = driver.command
    assert command[0].endswith("/devshim-sim")
    sim_file = folder / Path(command[command.index("--config") + 1]).relative_to(mount["mountPath"])
    (resource,) = load_config(sim_file).resources
    assert len(resource.initial_devices()) == 4


def test_legacy_sidecar_shares_a_private_plugin_dir_with_the_vendor_container(
    tmp_path: Path, no_devshim_env: None
) -> None:
    """The vendor plugin sees an emptyDir at the kubelet's usual path, devshim's legacy adapter
    serves kubelet.sock in that same emptyDir, and the vendor container never sees the host's
    device-plugins directory (it would register with the real kubelet, past devshim)."""
    docs = render(DEPLOY / "overlays" / "legacy-sidecar")
    daemonset = one(docs, "DaemonSet")
    folder, _ = config_files(docs, tmp_path)
    (driver,) = Settings.load(folder / "config.yaml").drivers
    assert driver.command[0].endswith("/devshim-legacy") and "--" not in driver.command  # sidecar form
    assert driver.user == "root"  # it dials the vendor plugin's socket, root's alone
    kubelet_dir = Path(driver.command[driver.command.index("--kubelet-dir") + 1])
    shared_mount, shared = mount_for(daemonset, kubelet_dir)
    assert shared_mount["mountPath"] == str(kubelet_dir) and "emptyDir" in shared
    (vendor,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] != "devshim"]
    vendor_mounts = {m["name"]: m["mountPath"] for m in vendor["volumeMounts"]}
    assert vendor_mounts == {shared_mount["name"]: "/var/lib/kubelet/device-plugins"}


def with_component(tmp_path: Path, target: str, component: str) -> Path:
    """A kustomization in tmp_path: deploy/TARGET with deploy/components/COMPONENT added."""
    overlay = tmp_path / f"with-{component}"
    overlay.mkdir()
    # kustomize refuses absolute paths to other kustomizations; relative ones may leave the root.
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / target, overlay)],
                "components": [os.path.relpath(DEPLOY / "components" / component, overlay)],
            }
        ),
        encoding="utf-8",
    )
    return overlay


def test_cdi_specs_component_mounts_the_nodes_cdi_folder_and_merges_with_dra(tmp_path: Path) -> None:
    """components/cdi-specs: the folder devshim writes the specs drivers ship into (cdi_dir),
    read-write at the host's /var/run/cdi; with components/dra too, one volume, not two."""
    daemonset = one(render(with_component(tmp_path, "overlays/sim-demo", "cdi-specs")), "DaemonSet")
    validate_strictly(daemonset, kubernetes_validate.latest_version())
    pod = daemonset["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["cdi"]["hostPath"] == {
        "path": "/var/run/cdi",
        "type": "DirectoryOrCreate",
    }
    mount = {m["name"]: m for m in devshim_container(daemonset)["volumeMounts"]}["cdi"]
    assert mount["mountPath"] == "/var/run/cdi" and not mount.get("readOnly")
    both = tmp_path / "both"
    both.mkdir()
    (both / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / "overlays/sim-demo", both)],
                "components": [
                    os.path.relpath(DEPLOY / "components" / c, both) for c in ("dra", "cdi-specs")
                ],
            }
        ),
        encoding="utf-8",
    )
    merged = one(render(both), "DaemonSet")["spec"]["template"]["spec"]
    assert [v["name"] for v in merged["volumes"]].count("cdi") == 1


def test_podmonitor_component_scrapes_the_ops_port(tmp_path: Path) -> None:
    """components/podmonitor added to an overlay. PodMonitor is a CRD (Prometheus Operator):
    kubernetes-validate ships only the built-in kinds' schemas, so it cannot be validated
    offline; its fields are checked against the DaemonSet here instead."""
    docs = render(with_component(tmp_path, "overlays/sim-demo", "podmonitor"))
    version = kubernetes_validate.latest_version()
    monitor = one(docs, "PodMonitor")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(monitor, version, strict=True)
    for doc in docs:
        if doc is not monitor:
            validate_strictly(doc, version)
    daemonset = one(docs, "DaemonSet")
    template = daemonset["spec"]["template"]
    assert monitor["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in devshim_container(daemonset)["ports"]}
    assert endpoint["path"] == template["metadata"]["annotations"]["prometheus.io/path"]


DRA_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
             "ValidatingAdmissionPolicyBinding"}  # fmt: skip
NODE_NAME_ENV = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
# Where devshim's API client (kr8s, src/shim/dra/kube.py) reads the in-cluster token, CA and
# namespace: its default, as devshim never names another.
TOKEN_DIR = KubeAuth()._serviceaccount
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")


def declared_drivers(docs: tuple[Doc, ...]) -> list[str]:
    """The admission policy's declaredDrivers: its first variable, a CEL list of strings (which
    the JSON of a list of strings is)."""
    first = one(docs, "ValidatingAdmissionPolicy")["spec"]["variables"][0]
    assert first["name"] == "declaredDrivers"
    names = json.loads(first["expression"])
    assert isinstance(names, list) and all(isinstance(n, str) for n in names), names
    return names


def configured_dra_drivers(docs: tuple[Doc, ...]) -> list[str]:
    """The DRA driver names of the DaemonSet's config.yaml, in order."""
    daemonset = one(docs, "DaemonSet")
    args = devshim_container(daemonset)["args"]
    _, volume = mount_for(daemonset, Path(args[args.index("--config") + 1]))
    config = yaml.safe_load(one(docs, "ConfigMap", volume["configMap"]["name"])["data"]["config.yaml"])
    return [driver["name"] for driver in (config.get("dra") or {}).get("drivers", [])]


def assert_token_readable_by_devshim_alone(daemonset: Doc) -> None:
    """No automounted token (mode 0644, in every container); a projected volume of the pod-bound
    token (the API server's audience, an hour), the cluster's CA and the namespace, mode 0400
    (root's: devshim's, not its drivers', which run as their own user), mounted read-only at
    TOKEN_DIR in devshim's container and in no other."""
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    projected = [v for v in pod["volumes"] if "projected" in v]
    assert [v["name"] for v in projected] == ["api-token"]
    assert projected[0]["projected"] == {
        "defaultMode": 0o400,
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [
                {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ],
    }  # fmt: skip
    holders = {c["name"]: m for c in pod["containers"] for m in c["volumeMounts"] if m["name"] == "api-token"}
    assert holders == {"devshim": {"name": "api-token", "mountPath": TOKEN_DIR, "readOnly": True}}


def assert_dra_objects_fit_the_daemonset(docs: tuple[Doc, ...]) -> None:
    """components/dra's objects (or the chart's with dra.enabled) point at each other and at the
    DaemonSet: its pods run as the account, mount its token for devshim alone and know their node;
    the binding grants the account the role; the policy matches the account's username, declares
    the config's DRA drivers, and is bound."""
    daemonset = one(docs, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    account = one(docs, "ServiceAccount")["metadata"]
    assert account["namespace"] == daemonset["metadata"]["namespace"]
    assert pod["serviceAccountName"] == account["name"]
    assert_token_readable_by_devshim_alone(daemonset)
    assert NODE_NAME_ENV in devshim_container(daemonset)["env"]
    role, binding = one(docs, "ClusterRole"), one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    subject = {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    assert binding["subjects"] == [subject]
    # What src/shim/dra/kube.py calls: never patch or deletecollection, a claim only by name (no
    # list, no watch), nothing but these three.
    verbs = {(tuple(r["apiGroups"]), tuple(r["resources"])): r["verbs"] for r in role["rules"]}
    assert verbs == {
        (("resource.k8s.io",), ("resourceslices",)): ["get", "list", "watch", "create", "update", "delete"],
        (("resource.k8s.io",), ("resourceclaims",)): ["get"],
        (("",), ("nodes",)): ["get"],
    }
    # The kubelet plugin's directories: the CDI dir (made if missing), read-write at the host's
    # path; plugins_registry is the base's. Each driver's plugins folder: assert_paths_on_host_volumes.
    for name, kind in (("cdi", "DirectoryOrCreate"), ("plugins-registry", "Directory")):
        (mount,) = [m for m in devshim_container(daemonset)["volumeMounts"] if m["name"] == name]
        host = volumes(daemonset)[name]["hostPath"]
        assert (host["path"], host["type"]) == (mount["mountPath"], kind) and not mount.get("readOnly"), name
    policy = one(docs, "ValidatingAdmissionPolicy")
    policy_binding = one(docs, "ValidatingAdmissionPolicyBinding")
    username = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "{username}"'
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "resources": ["resourceslices"],
                    "operations": ["CREATE", "UPDATE", "DELETE"]}  # fmt: skip
    assert policy["spec"]["matchConstraints"]["matchPolicy"] == "Equivalent"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert declared_drivers(docs) == configured_dra_drivers(docs)
    assert policy_binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_dra_component_grants_the_publisher_its_calls_and_the_policy_its_account(
    tmp_path: Path, no_devshim_env: None
) -> None:
    """components/dra added to an overlay: every object strictly valid (the cluster-scoped ones
    without a namespace), labelled as the base's, and fitting the DaemonSet; the base alone
    still mounts no token and no DRA directory; alone it declares no DRA driver (overlays/dra-sim
    declares one). tests/compat/test_dra_rbac.py applies it to a real API server."""
    docs = render(with_component(tmp_path, "overlays/sim-demo", "dra"))
    version = kubernetes_validate.latest_version()
    assert {d["kind"] for d in docs} == {"Namespace", "ConfigMap", "DaemonSet"} | DRA_KINDS
    daemonset = one(docs, "DaemonSet")
    for doc in docs:
        validate_strictly(doc, version)
        if doc["kind"] in DRA_KINDS:
            assert doc["metadata"]["labels"] == daemonset["metadata"]["labels"], doc["kind"]
            namespaced = doc["kind"] == "ServiceAccount"
            assert doc["metadata"].get("namespace") == (NAMESPACE if namespaced else None), doc["kind"]
    assert_dra_objects_fit_the_daemonset(docs)
    # Alone it declares no driver: no slice may be written, no plugins folder is mounted.
    assert declared_drivers(docs) == []
    assert_only_driver_folders_mounted(daemonset, DEFAULT_PLUGINS_DIR, [])
    base_pod = one(render(DEPLOY / "base"), "DaemonSet")["spec"]["template"]["spec"]
    assert base_pod["automountServiceAccountToken"] is False and "serviceAccountName" not in base_pod
    assert not {"plugins", "cdi"} & {v["name"] for v in base_pod["volumes"]}


def test_dra_sim_overlay_names_its_driver_alike_in_config_policy_and_mounts(
    tmp_path: Path, no_devshim_env: None
) -> None:
    """overlays/dra-sim, the example to copy: the driver config.yaml publishes is the one the
    admission policy lets devshim write slices of and the one plugins folder mounted (no other,
    nor all of plugins/); the token is devshim's alone; the sim serves its pool's four devices."""
    docs = render(DEPLOY / "overlays" / "dra-sim")
    assert_dra_objects_fit_the_daemonset(docs)
    folder, mount = config_files(docs, tmp_path)
    settings = Settings.load(folder / "config.yaml")
    (driver,) = settings.dra.drivers
    assert driver.name == "sim.example.com" and declared_drivers(docs) == [driver.name]
    assert_only_driver_folders_mounted(one(docs, "DaemonSet"), settings.dra.plugins_dir, [driver.name])
    (sim,) = settings.drivers
    sim_file = folder / Path(sim.command[sim.command.index("--config") + 1]).relative_to(mount["mountPath"])
    (resource,) = load_config(sim_file).resources
    assert resource.name in driver.resources and len(resource.initial_devices()) == 4


def test_the_token_path_mounted_is_where_devshims_api_client_reads() -> None:
    """devshim's in-cluster credentials come from kr8s's default folder (src/shim/dra/kube.py
    passes none other): the projected volume must be mounted exactly there."""
    assert TOKEN_DIR == "/var/run/secrets/kubernetes.io/serviceaccount"
    source = (ROOT / "src" / "shim" / "dra" / "kube.py").read_text(encoding="utf-8")
    assert "serviceaccount=" not in source

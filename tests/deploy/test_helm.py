"""The Helm chart deploy/helm/devshim (docs/helm.md): `helm lint --strict`, `helm template` for each
values file (deploy/examples/helm/, the chart's ci/) with every object validated offline as the kustomize
manifests are (tests/deploy/test_manifests.py), each value file checked for what it says it does,
the default render compared with `kubectl kustomize deploy/base`, and docs/helm.md's commands and
values examples run. helm is the pinned build of scripts/build_helm.py (tests/deploy/tools.py)."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from adapters.sim.config import load_config
from scripts import build_helm
from shim.nodeconfig import NodeConfigs
from shim.settings import Settings
from tests.deploy.test_manifests import (
    DEFAULT_PLUGINS_DIR,
    DRA_KINDS,
    IMAGE_VENV_BIN,
    NAMESPACE,
    NODE_NAME_ENV,
    Doc,
    assert_dra_objects_fit_the_daemonset,
    assert_only_driver_folders_mounted,
    assert_paths_on_host_volumes,
    assert_termination_log_mountable,
    config_files,
    declared_drivers,
    devshim_container,
    mount_for,
    one,
    validate_strictly,
    volumes,
    with_component,
)
from tests.deploy.test_manifests import render as kustomize
from tests.deploy.tools import DEPLOY, PROJECT, ROOT, require_helm
from tests.support.toolchains import REQUIRE_ENV

CHART = DEPLOY / "helm" / "devshim"
# The values files users start from (docs/helm.md), and the chart's own variants for the tests.
EXAMPLES = DEPLOY / "examples" / "helm"
# Every values file, by name (a new one is linted, rendered and validated unasked).
VALUES = {p.name: p for p in [*(CHART / "ci").glob("*-values.yaml"), *EXAMPLES.glob("*.yaml")]}
VALUE_FILES = sorted(VALUES)
# The release name that, with NAMESPACE, gives the base's fixed names (devshim, devshim-config).
RELEASE = "devshim"
DOCS = ROOT / "docs" / "helm.md"
KUBELET_VOLUMES = ("device-plugins", "plugins-registry", "pod-resources")


def helm(*args: str) -> str:
    """helm's output for ARGS, run from the repository root; a failure fails the test with stderr."""
    result = subprocess.run(
        [require_helm(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert result.returncode == 0, f"helm {shlex.join(args)}:\n{result.stderr}"
    return result.stdout


def helm_fails(*args: str) -> str:
    """helm's stderr for ARGS, which must fail."""
    result = subprocess.run(
        [require_helm(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert result.returncode != 0, f"helm {shlex.join(args)} succeeded"
    return result.stderr


@cache
def render(*args: str) -> tuple[Doc, ...]:
    """`helm template` of the chart as release RELEASE in NAMESPACE, ARGS its value flags."""
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def render_file(name: str) -> tuple[Doc, ...]:
    return render("--values", str(VALUES[name]))


def values_file(name: str) -> Doc:
    return yaml.safe_load(VALUES[name].read_text(encoding="utf-8")) or {}


def chart_values() -> Doc:
    values: Doc = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    return values


def validate_all(docs: tuple[Doc, ...]) -> None:
    """Every object strictly valid; a PodMonitor (a CRD: kubernetes-validate has no schema for
    it, as in test_manifests.py) is checked by the tests that render one instead."""
    version = kubernetes_validate.latest_version()
    for doc in docs:
        if doc["kind"] == "PodMonitor":
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(doc, version, strict=True)
        else:
            validate_strictly(doc, version)


def pod_spec(docs: tuple[Doc, ...]) -> Doc:
    spec: Doc = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def loaded_settings(docs: tuple[Doc, ...], tmp_path: Path) -> tuple[Settings, Path, Doc]:
    """The rendered config as devshim loads it, the folder its ConfigMap was written to, the mount."""
    folder, mount = config_files(docs, tmp_path)
    return Settings.load(folder / "config.yaml"), folder, mount


@pytest.fixture
def no_devshim_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings read DEVSHIM_* variables too: check the rendered files alone. The tests' own two
    stay: which helm, and whether a missing one fails (Settings has no such fields). NODE_NAME is
    the pod's (the downward API's, with dra.enabled), which a config with DRA drivers needs."""
    kept = {build_helm.OVERRIDE_ENV, REQUIRE_ENV}
    for key in [k for k in os.environ if k.startswith("DEVSHIM_") and k not in kept]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("NODE_NAME", "node-a")
    yield


def test_the_chart_is_versioned_as_devshim() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["apiVersion"] == "v2"  # Helm 3 and 4 both install it
    assert chart["version"] == chart["appVersion"] == PROJECT["version"]


def test_helm_is_the_pinned_build() -> None:
    version = helm("version", "--template", "{{.Version}}")
    if not os.environ.get(build_helm.OVERRIDE_ENV):
        assert version == build_helm.HELM_VERSION


@pytest.mark.parametrize("values", VALUE_FILES)
def test_lint_is_clean_even_strict(values: str) -> None:
    out = helm("lint", "--strict", str(CHART), "--values", str(VALUES[values]))
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize("values", VALUE_FILES)
def test_every_object_validates_strictly(values: str) -> None:
    docs = render_file(values)
    monitor = values_file(values).get("podMonitor", {}).get("enabled", False)
    dra = sorted(DRA_KINDS) if values_file(values).get("dra", {}).get("enabled", False) else []
    expected = ["ConfigMap", "DaemonSet"] + ["PodMonitor"] * monitor + dra
    if values_file(values).get("nodeConfigs", {}).get("configs"):
        expected += ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    assert sorted(d["kind"] for d in docs) == sorted(expected)
    validate_all(docs)


@pytest.mark.parametrize("values", VALUE_FILES)
def test_objects_are_labelled_and_namespaced(values: str) -> None:
    docs = render_file(values)
    for doc in docs:
        labels = doc["metadata"]["labels"]
        # dra.enabled's RBAC and admission policy objects are cluster-scoped.
        cluster_scoped = doc["kind"] in DRA_KINDS - {"ServiceAccount"}
        assert doc["metadata"].get("namespace") == (None if cluster_scoped else NAMESPACE)
        assert labels["app.kubernetes.io/name"] == "devshim"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/version"] == PROJECT["version"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
    daemonset = one(docs, "DaemonSet")
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "devshim", "app.kubernetes.io/instance": RELEASE}
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("values", VALUE_FILES)
def test_what_no_value_changes_holds_for_every_value_file(values: str) -> None:
    """The base's properties that no value file touches (test_manifests.py asserts them of the
    kustomize forms): surge without host ports, probes on the ops port, devshim's container
    root without privileges and with the kubelet's directories mounted as the host has them;
    no automounted token (the DRA values mount one for devshim alone)."""
    daemonset = one(render_file(values), "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert not pod.get("hostNetwork")
    assert all("hostPort" not in p for c in pod["containers"] for p in c.get("ports", []))
    container = devshim_container(daemonset)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ops"}
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert (
        security["capabilities"] == {"drop": ["ALL"], "add": ["SETUID", "SETGID"]}
        and security["readOnlyRootFilesystem"] is True
    )
    for name in KUBELET_VOLUMES:
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == name]
        assert volumes(daemonset)[name]["hostPath"]["path"] == mount["mountPath"]
        assert mount.get("readOnly", False) is (name == "pod-resources")
    assert pod["automountServiceAccountToken"] is False
    assert_termination_log_mountable(daemonset)


@pytest.mark.parametrize("values", VALUE_FILES)
def test_rendered_config_loads_and_lies_on_the_host_paths(
    values: str, tmp_path: Path, no_devshim_env: None
) -> None:
    """The ConfigMap's config.yaml is valid Settings (strict: unknown keys fail), every node path
    in it is on a hostPath volume mounted at that same path (read-write where devshim writes),
    the ops port is its http.port, and each driver's program is one the image installs."""
    docs = render_file(values)
    daemonset = one(docs, "DaemonSet")
    settings, folder, config_mount = loaded_settings(docs, tmp_path)
    assert_paths_on_host_volumes(daemonset, settings)
    (port,) = devshim_container(daemonset)["ports"]
    assert (port["name"], port["containerPort"]) == ("ops", settings.http.port)
    for driver in settings.drivers:
        program = driver.command[0]
        assert program.startswith(IMAGE_VENV_BIN) and program[len(IMAGE_VENV_BIN) :] in PROJECT["scripts"]
        for arg in driver.command[1:]:
            if arg.startswith(config_mount["mountPath"] + "/"):
                assert (folder / Path(arg).relative_to(config_mount["mountPath"])).exists(), arg


def _helm_side(doc: Doc) -> Doc:
    """The chart's object less what is Helm's own: the helm.sh/chart and managed-by labels, the
    pods' checksum/config annotation, and the ConfigMap's name wherever it appears."""
    doc = copy.deepcopy(doc)
    metas = [doc["metadata"]] + ([doc["spec"]["template"]["metadata"]] if doc["kind"] == "DaemonSet" else [])
    for meta in metas:
        assert meta["labels"].pop("helm.sh/chart") == f"devshim-{PROJECT['version']}"
        assert meta["labels"].pop("app.kubernetes.io/managed-by") == "Helm"
    if doc["kind"] == "DaemonSet":
        checksum = doc["spec"]["template"]["metadata"]["annotations"].pop("checksum/config")
        assert re.fullmatch(r"[0-9a-f]{64}", checksum)
        (volume,) = [v for v in doc["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
        assert volume["configMap"]["name"] == "devshim-config"
        volume["configMap"]["name"] = "<the ConfigMap>"
    else:
        assert doc["metadata"]["name"] == "devshim-config"
        doc["metadata"]["name"] = "<the ConfigMap>"
    return doc


def _kustomize_side(doc: Doc) -> Doc:
    """The base's object less what is kustomize's own: the managed-by label and the hash in the
    ConfigMap's name wherever it appears."""
    doc = copy.deepcopy(doc)
    metas = [doc["metadata"]] + ([doc["spec"]["template"]["metadata"]] if doc["kind"] == "DaemonSet" else [])
    for meta in metas:
        assert meta["labels"].pop("app.kubernetes.io/managed-by") == "kustomize"
    hashed = re.compile(r"devshim-config-[a-z0-9]{10}")
    if doc["kind"] == "DaemonSet":
        (volume,) = [v for v in doc["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
        assert hashed.fullmatch(volume["configMap"]["name"])
        volume["configMap"]["name"] = "<the ConfigMap>"
    else:
        assert hashed.fullmatch(doc["metadata"]["name"])
        doc["metadata"]["name"] = "<the ConfigMap>"
    return doc


def _parsed_config(configmap: Doc) -> Doc:
    """config.yaml parsed: the chart writes it from values (no comments, keys sorted), the base
    ships a commented file; the settings must be the same, not the text."""
    configmap = copy.deepcopy(configmap)
    configmap["data"]["config.yaml"] = yaml.safe_load(configmap["data"]["config.yaml"])
    return configmap


def _differences(chart: object, base: object, path: str = "") -> list[str]:
    """Where CHART and BASE differ, one line each, by the path to the field."""
    if isinstance(chart, dict) and isinstance(base, dict):
        return [
            line
            for key in sorted(chart.keys() | base.keys())
            for line in _differences(chart.get(key, "<absent>"), base.get(key, "<absent>"), f"{path}.{key}")
        ]
    if isinstance(chart, list) and isinstance(base, list) and len(chart) == len(base):
        pairs = enumerate(zip(chart, base, strict=True))
        return [line for i, (c, b) in pairs for line in _differences(c, b, f"{path}[{i}]")]
    return [] if chart == base else [f"{path or '.'}: chart {chart!r}, base {base!r}"]


def test_default_values_render_the_kustomize_base() -> None:
    """`helm template` with the default values and `kubectl kustomize deploy/base` give the same
    DaemonSet and ConfigMap, once what each tool does its own way is set aside, and only that:

    - labels: helm.sh/chart (Helm's only) and app.kubernetes.io/managed-by (Helm vs kustomize),
      on the objects and the pod template;
    - the ConfigMap's name: kustomize appends a hash of its content (so a changed config renames
      it and rolls the pods), the chart keeps devshim-config and rolls the pods by a
      checksum/config annotation on the pod template (dropped here) instead;
    - config.yaml compared parsed, not as text (comments and key order differ).

    The release name and namespace are chosen to be the base's, so no other name differs. The
    base's Namespace has no counterpart: the chart renders namespaced objects only (docs/helm.md).
    """
    chart, base = render(), kustomize(DEPLOY / "base")
    assert {d["kind"] for d in base} - {d["kind"] for d in chart} == {"Namespace"}
    differences = _differences(_helm_side(one(chart, "DaemonSet")), _kustomize_side(one(base, "DaemonSet")))
    differences += _differences(
        _parsed_config(_helm_side(one(chart, "ConfigMap"))),
        _parsed_config(_kustomize_side(one(base, "ConfigMap"))),
    )
    assert not differences, "the chart's defaults and deploy/base differ:\n" + "\n".join(differences)


def test_a_changed_config_rolls_the_pods() -> None:
    def checksum(*args: str) -> str:
        annotations = one(render(*args), "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
        value: str = annotations["checksum/config"]
        return value

    assert checksum() != checksum("--set", "config.log_level=DEBUG")
    assert checksum() == checksum("--set", "image.tag=9.9.9")  # the image rolls the pods itself


def test_legacy_sidecar_values_share_a_private_plugin_dir_with_the_vendor_container(
    tmp_path: Path, no_devshim_env: None
) -> None:
    """As deploy/overlays/legacy-sidecar (test_manifests.py): the vendor plugin sees an emptyDir at
    its usual path, devshim's legacy adapter serves kubelet.sock in that same emptyDir, the vendor
    container never sees the host's device-plugins directory; plus the values' extras."""
    docs = render_file("legacy-sidecar.yaml")
    sidecar = values_file("legacy-sidecar.yaml")["legacySidecar"]
    daemonset = one(docs, "DaemonSet")
    settings, _, _ = loaded_settings(docs, tmp_path)
    (driver,) = settings.drivers
    command = driver.command
    assert driver.name == "legacy" and command[0] == f"{IMAGE_VENV_BIN}devshim-legacy"
    assert "--" not in command  # the sidecar form: no plugin command
    resource_args = [arg for r in sidecar["deviceResources"] for arg in ("--resource", r)]
    assert command[command.index("--kubelet-dir") + 2 :] == sidecar["adapterArgs"] + resource_args
    assert driver.resources == sidecar["deviceResources"]
    assert driver.user == "root"  # it dials the vendor plugin's socket, root's alone
    assert driver.policy is not None
    assert driver.policy.mounts == sidecar["policy"]["mounts"]
    assert driver.policy.device_nodes == sidecar["policy"]["device_nodes"]
    kubelet_dir = Path(command[command.index("--kubelet-dir") + 1])
    shared_mount, shared = mount_for(daemonset, kubelet_dir)
    assert shared_mount["mountPath"] == str(kubelet_dir)
    assert shared == {"name": shared_mount["name"], "emptyDir": {}}
    (vendor,) = [c for c in pod_spec(docs)["containers"] if c["name"] != "devshim"]
    assert vendor["name"] == "vendor-plugin"
    assert vendor["image"] == f"{sidecar['image']['repository']}:{sidecar['image']['tag']}"
    assert vendor["securityContext"] == {"privileged": True}
    vendor_mounts = {m["name"]: m["mountPath"] for m in vendor["volumeMounts"]}
    assert vendor_mounts == {shared_mount["name"]: "/var/lib/kubelet/device-plugins"}
    assert devshim_container(daemonset)["securityContext"]["privileged"] is False


def test_node_selection_values_reach_the_pod() -> None:
    values = values_file("node-selection.yaml")
    docs = render_file("node-selection.yaml")
    pod = pod_spec(docs)
    assert pod["nodeSelector"]["feature.node.kubernetes.io/pci-10de.present"] == "true"
    for key in ("nodeSelector", "affinity", "tolerations", "priorityClassName", "imagePullSecrets"):
        assert pod[key] == values[key], key
    container = devshim_container(one(docs, "DaemonSet"))
    assert container["resources"] == values["resources"]
    image = values["image"]
    assert container["image"] == f"{image['repository']}:{image['tag']}"
    assert container["imagePullPolicy"] == image["pullPolicy"]


def test_empty_node_selection_values_leave_the_fields_out() -> None:
    flags = ["priorityClassName=", "tolerations=null", "nodeSelector=null"]
    pod = pod_spec(render(*(arg for flag in flags for arg in ("--set", flag))))
    assert not {"priorityClassName", "tolerations", "nodeSelector", "affinity"} & pod.keys()


def test_kubelet_root_dir_values_move_every_kubelet_path(tmp_path: Path, no_devshim_env: None) -> None:
    """Every hostPath volume of the kubelet's directories and every kubelet path in the config
    lies under the custom root dir (its trailing slash dropped); /var/lib/kubelet is nowhere."""
    values = values_file("kubelet-root-dir-values.yaml")
    root = Path(values["kubeletRootDir"])
    docs = render_file("kubelet-root-dir-values.yaml")
    daemonset = one(docs, "DaemonSet")
    for name in KUBELET_VOLUMES:
        assert Path(volumes(daemonset)[name]["hostPath"]["path"]).parent == root
    settings, _, _ = loaded_settings(docs, tmp_path)
    assert settings.device_plugins_dir == root / "device-plugins"
    assert settings.plugins_registry_dir == root / "plugins_registry"
    assert settings.deallocation.pod_resources_socket == root / "pod-resources" / "kubelet.sock"
    assert settings.state_dir == Path(values["config"]["state_dir"])
    assert volumes(daemonset)["state"]["hostPath"]["path"] == values["config"]["state_dir"]
    text = yaml.safe_dump_all(docs)
    assert "/var/lib/kubelet" not in text and "//" not in text.replace("://", "")


def test_kubelet_root_dir_values_move_the_dra_plugin_dir(tmp_path: Path, no_devshim_env: None) -> None:
    """With DRA too (examples/helm/dra.yaml added): the kubelet's plugins directory, where the DRA
    sockets go, is mounted from under the custom root and is the config's dra.plugins_dir; the CDI
    directory is the container runtime's, not the kubelet's, and stays /var/run/cdi."""
    root = Path(values_file("kubelet-root-dir-values.yaml")["kubeletRootDir"])
    docs = render(*(arg for name in ("kubelet-root-dir-values.yaml", "dra.yaml")
                    for arg in ("--values", str(VALUES[name]))))  # fmt: skip
    daemonset = one(docs, "DaemonSet")
    settings, _, _ = loaded_settings(docs, tmp_path)
    assert settings.dra.plugins_dir == root / "plugins"
    assert settings.plugins_registry_dir == root / "plugins_registry"
    assert volumes(daemonset)["dra-plugin-0"]["hostPath"]["path"] == str(root / "plugins" / "sim.example.com")
    assert settings.dra.cdi_dir == Path("/var/run/cdi")
    assert_paths_on_host_volumes(daemonset, settings)
    assert "/var/lib/kubelet" not in yaml.safe_dump_all(docs)


def test_podmonitor_values_scrape_the_ops_port() -> None:
    """As components/podmonitor (test_manifests.py), on the values' port and interval, with the
    labels a Prometheus selects by, and no scrape annotations beside it."""
    values = values_file("podmonitor-values.yaml")
    docs = render_file("podmonitor-values.yaml")
    monitor, daemonset = one(docs, "PodMonitor"), one(docs, "DaemonSet")
    template = daemonset["spec"]["template"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    assert values["podMonitor"]["labels"].items() <= monitor["metadata"]["labels"].items()
    assert monitor["spec"]["selector"]["matchLabels"] == daemonset["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "ops", "path": "/metrics", "interval": values["podMonitor"]["interval"]}
    ports = {p["name"]: p["containerPort"] for p in devshim_container(daemonset)["ports"]}
    assert ports == {"ops": values["config"]["http"]["port"]}
    assert not any(key.startswith("prometheus.io/") for key in template["metadata"]["annotations"])


def test_sim_driver_values_serve_four_simulated_devices(tmp_path: Path, no_devshim_env: None) -> None:
    """As deploy/overlays/sim-demo (test_manifests.py), from `drivers` and `configFiles`."""
    values = values_file("sim-driver.yaml")
    settings, folder, mount = loaded_settings(render_file("sim-driver.yaml"), tmp_path)
    (driver,) = settings.drivers
    assert driver.command == values["drivers"][0]["command"]
    # What it may serve and grant reaches the config as the values declare it.
    assert driver.resources == values["drivers"][0]["resources"]
    assert driver.policy.model_dump(exclude_defaults=True) == values["drivers"][0]["policy"]
    sim_path = Path(driver.command[driver.command.index("--config") + 1])
    (resource,) = load_config(folder / sim_path.relative_to(mount["mountPath"])).resources
    assert len(resource.initial_devices()) == 4


def test_extras_values_reach_the_pod() -> None:
    values = values_file("extras-values.yaml")
    docs = render_file("extras-values.yaml")
    daemonset = one(docs, "DaemonSet")
    assert daemonset["metadata"]["name"] == values["fullnameOverride"]
    assert one(docs, "ConfigMap")["metadata"]["name"] == f"{values['fullnameOverride']}-config"
    container = devshim_container(daemonset)
    assert container["env"] == values["env"]
    assert container["volumeMounts"][-1] == values["extraVolumeMounts"][0]
    assert volumes(daemonset)["sys"] == values["extraVolumes"][0]
    assert pod_spec(docs)["containers"][1:] == values["extraContainers"]
    template = daemonset["spec"]["template"]["metadata"]
    assert values["podAnnotations"].items() <= template["annotations"].items()
    assert values["podLabels"].items() <= template["labels"].items()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--set", "kubeletRootDir=var/lib/kubelet"], "kubeletRootDir must be an absolute directory"),
        (["--set", "config.device_plugins_dir=/x"], "config.device_plugins_dir is set from kubeletRootDir"),
        (["--set", "config.dra.plugins_dir=/x"], "config.dra.plugins_dir is set from kubeletRootDir"),
        (
            ["--set", "config.deallocation.pod_resources_socket=/x.sock"],
            "config.deallocation.pod_resources_socket is set from kubeletRootDir",
        ),
        (["--set-string", "configFiles.config\\.yaml=x"], "configFiles cannot hold config.yaml"),
        (
            ["--set", "legacySidecar.enabled=true"],
            "legacySidecar.deviceResources: name the resources the vendor plugin registers",
        ),
        (
            [
                "--set",
                "config.dra.drivers[0].name=gpu.example.com",
                "--set",
                "config.dra.drivers[0].resources[0]=example.com/gpu",
            ],
            "config.dra.drivers publishes ResourceSlices through the API server: set dra.enabled",
        ),  # fmt: skip
        (
            ["--set", "dra.enabled=true", "--set", "config.dra.drivers[0].name=../../../etc"],
            'config.dra.drivers[0].name: "../../../etc" is not a DRA driver name',
        ),
        (
            ["--set", "dra.enabled=true", "--set", "config.dra.drivers[0].resources[0]=example.com/gpu"],
            'config.dra.drivers[0].name: "" is not a DRA driver name',
        ),
    ],
)
def test_values_the_pods_could_not_run_with_fail_the_render(flags: list[str], message: str) -> None:
    assert message in helm_fails("template", RELEASE, str(CHART), *flags)


def _tool_neutral(doc: Doc) -> Doc:
    """components/dra's or the chart's DRA object less its one tool-made label difference: the
    chart's helm.sh/chart and managed-by Helm, the component's managed-by kustomize."""
    doc = copy.deepcopy(doc)
    labels = doc["metadata"]["labels"]
    labels.pop("helm.sh/chart", None)
    assert labels.pop("app.kubernetes.io/managed-by") in ("Helm", "kustomize")
    return doc


def test_dra_enabled_renders_the_dra_component(tmp_path: Path) -> None:
    """`--set dra.enabled=true` and deploy/base with components/dra give the same objects: the
    service account, the ClusterRole and its binding, the admission policy and its binding field
    for field (their rules and CEL included), and the same DaemonSet (the service account, the
    token, NODE_NAME), once each tool's own ways are set aside (test_default_values_render_the_
    kustomize_base). Disabled, the chart renders none of it (the default comparison)."""
    chart = render("--set", "dra.enabled=true")
    base = kustomize(with_component(tmp_path, "base", "dra"))
    assert {d["kind"] for d in base} - {d["kind"] for d in chart} == {"Namespace"}
    differences = []
    for kind in sorted(DRA_KINDS):
        differences += _differences(_tool_neutral(one(chart, kind)), _tool_neutral(one(base, kind)), kind)
    differences += _differences(_helm_side(one(chart, "DaemonSet")), _kustomize_side(one(base, "DaemonSet")))
    assert not differences, "dra.enabled and components/dra differ:\n" + "\n".join(differences)


def test_dra_values_publish_as_the_releases_account(tmp_path: Path, no_devshim_env: None) -> None:
    """examples/helm/dra.yaml: the config names the DRA driver, the pods get NODE_NAME and the
    account's token, and every DRA object follows the release's name (another release, another
    account, and the policy matches that one)."""
    docs = render_file("dra.yaml")
    settings, _, _ = loaded_settings(docs, tmp_path)
    (driver,) = settings.dra.drivers
    assert (driver.name, driver.resources) == ("sim.example.com", ["example.com/sim"])
    assert settings.dra.node_name == "node-a"  # NODE_NAME, as the downward API gives it
    assert_dra_objects_fit_the_daemonset(docs)
    assert devshim_container(one(docs, "DaemonSet"))["env"] == [NODE_NAME_ENV]
    values = str(VALUES["dra.yaml"])
    out = helm("template", "gpu", str(CHART), "--namespace", "accel", "--values", values)
    other = tuple(doc for doc in yaml.safe_load_all(out) if doc)
    assert_dra_objects_fit_the_daemonset(other)
    assert one(other, "ServiceAccount")["metadata"] == one(other, "ServiceAccount")["metadata"] | {
        "name": "gpu-devshim", "namespace": "accel"}  # fmt: skip
    assert one(other, "ClusterRole")["metadata"]["name"] == "gpu-devshim-dra"
    assert one(other, "ValidatingAdmissionPolicy")["metadata"]["name"] == "gpu-devshim-dra-node-slices"


def test_dra_drivers_with_a_kubeconfig_of_their_own_need_no_dra_enabled() -> None:
    """config.dra.kubeconfig (e.g. a mounted Secret) is the other way to the API server: the
    render then passes, without the service account and the token."""
    docs = render(
        "--set", "config.dra.drivers[0].name=gpu.example.com",
        "--set", "config.dra.drivers[0].resources[0]=example.com/gpu",
        "--set", "config.dra.kubeconfig=/etc/devshim-kube/kubeconfig",
    )  # fmt: skip
    assert not {d["kind"] for d in docs} & DRA_KINDS
    assert pod_spec(docs)["automountServiceAccountToken"] is False
    assert not any("projected" in v for v in pod_spec(docs)["volumes"])
    # Still each DRA driver's kubelet plugin: the driver's DRA socket folder and the CDI specs'
    # directory are mounted, the latter from config.dra.cdi_dir where it is set.
    daemonset = one(docs, "DaemonSet")
    assert_only_driver_folders_mounted(daemonset, DEFAULT_PLUGINS_DIR, ["gpu.example.com"])
    assert volumes(daemonset)["cdi"]["hostPath"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}
    moved = one(render("--set", "config.dra.cdi_dir=/etc/cdi", "--set", "dra.enabled=true"), "DaemonSet")
    assert volumes(moved)["cdi"]["hostPath"] == {"path": "/etc/cdi", "type": "DirectoryOrCreate"}
    assert mount_for(moved, Path("/etc/cdi/devshim-x.json"))[0]["mountPath"] == "/etc/cdi"


def test_the_cdi_folder_for_shipped_specs_is_mounted_only_where_config_sets_it() -> None:
    """config.cdi_dir (protocol 1.2: drivers ship CDI specs) is mounted read-write from the host;
    unset, no CDI folder is (least privilege); the same folder as DRA's is mounted once."""
    assert "shipped-cdi" not in volumes(one(render(), "DaemonSet"))
    shipping = one(render("--set", "config.cdi_dir=/etc/cdi"), "DaemonSet")
    assert volumes(shipping)["shipped-cdi"]["hostPath"] == {"path": "/etc/cdi", "type": "DirectoryOrCreate"}
    assert mount_for(shipping, Path("/etc/cdi/devshim-driver-x@a.com+b.json"))[0]["mountPath"] == "/etc/cdi"
    both = one(
        render(
            "--set",
            "config.cdi_dir=/var/run/cdi",
            "--set",
            "dra.enabled=true",
            "--set",
            "config.dra.drivers[0].name=gpu.example.com",
            "--set",
            "config.dra.drivers[0].resources[0]=example.com/gpu",
        ),  # fmt: skip
        "DaemonSet",
    )
    assert "cdi" in volumes(both) and "shipped-cdi" not in volumes(both)


def _doc_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOCS.read_text(encoding="utf-8"), re.S | re.M)


def _doc_helm_commands() -> list[list[str]]:
    """Each `helm` command of docs/helm.md's sh blocks, its continuation lines joined."""
    commands = []
    for block in _doc_blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("helm "):
                commands.append(shlex.split(line)[1:])
    return commands


def test_documented_helm_commands_run() -> None:
    """What can run without a cluster runs as written: template and lint; install with
    --dry-run=client added (helm then renders without a cluster). upgrade needs the cluster's
    release, so its arguments are rendered by `helm template` (they share the release, chart and
    value flags); uninstall is only checked for the release and namespace."""
    commands = _doc_helm_commands()
    assert {c[0] for c in commands} == {"install", "upgrade", "uninstall", "template", "lint"}
    for command in commands:
        if command[0] in ("template", "lint"):
            helm(*command)
        elif command[0] == "install":
            assert "MANIFEST:" in helm(*command, "--dry-run=client")
        elif command[0] == "upgrade":
            validate_all(tuple(d for d in yaml.safe_load_all(helm("template", *command[1:])) if d))
        else:
            assert command[1:] == ["devshim", "--namespace", NAMESPACE]


def test_documented_namespace_label_is_the_bases() -> None:
    """The chart leaves the namespace to the reader (docs/helm.md): its label must be the one
    the kustomize base's Namespace has."""
    label = one(kustomize(DEPLOY / "base"), "Namespace")["metadata"]["labels"]
    text = DOCS.read_text(encoding="utf-8")
    assert f"kubectl create namespace {NAMESPACE}" in text
    expected = f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce="
    assert expected + label["pod-security.kubernetes.io/enforce"] in text


@pytest.mark.parametrize("index", range(len(_doc_blocks("yaml"))))
def test_documented_values_examples_render_and_validate(
    index: int, tmp_path: Path, no_devshim_env: None
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(_doc_blocks("yaml")[index], encoding="utf-8")
    docs = render("--values", str(values))
    validate_all(docs)
    (tmp_path / "configmap").mkdir()
    Settings.load(config_files(docs, tmp_path / "configmap")[0] / "config.yaml")


def test_documented_values_table_names_every_value() -> None:
    section = DOCS.read_text(encoding="utf-8").split("\n## Values\n", 1)[1].split("\n#", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| `"))
    for key in chart_values():
        assert re.search(rf"`{key}[`.]", table), f"docs/helm.md's values table lacks {key}"


def test_dra_values_render_the_dra_sim_overlay(tmp_path: Path, no_devshim_env: None) -> None:
    """examples/helm/dra.yaml and deploy/overlays/dra-sim (the same DRA driver, sim.example.com) give the
    same DRA objects, the admission policy's declared drivers included, and the same DaemonSet
    (that one driver's plugins folder alone, the token for devshim alone), once each tool's own
    ways are set aside; and both configs declare that driver."""
    chart, base = render_file("dra.yaml"), kustomize(DEPLOY / "overlays" / "dra-sim")
    assert declared_drivers(chart) == declared_drivers(base) == ["sim.example.com"]
    differences = []
    for kind in sorted(DRA_KINDS):
        differences += _differences(_tool_neutral(one(chart, kind)), _tool_neutral(one(base, kind)), kind)
    differences += _differences(_helm_side(one(chart, "DaemonSet")), _kustomize_side(one(base, "DaemonSet")))
    assert not differences, "examples/helm/dra.yaml and overlays/dra-sim differ:\n" + "\n".join(differences)
    (tmp_path / "chart").mkdir()
    (tmp_path / "base").mkdir()
    charted, _, _ = loaded_settings(chart, tmp_path / "chart")
    based = Settings.load(config_files(base, tmp_path / "base")[0] / "config.yaml")
    assert charted.dra.drivers == based.dra.drivers


def test_the_policy_declares_every_configured_dra_driver(tmp_path: Path, no_devshim_env: None) -> None:
    """Two DRA drivers in config.dra.drivers: the policy declares both, in order, the pods mount
    the two folders and nothing else of plugins/; without drivers it declares none."""
    docs = render(
        "--set", "dra.enabled=true",
        "--set", "config.dra.drivers[0].name=gpu.example.com",
        "--set", "config.dra.drivers[0].resources[0]=example.com/gpu",
        "--set", "config.dra.drivers[1].name=nic.example.org",
        "--set", "config.dra.drivers[1].resources[0]=example.org/nic",
    )  # fmt: skip
    assert declared_drivers(docs) == ["gpu.example.com", "nic.example.org"]
    assert_dra_objects_fit_the_daemonset(docs)
    settings, _, _ = loaded_settings(docs, tmp_path)
    assert_paths_on_host_volumes(one(docs, "DaemonSet"), settings)
    assert declared_drivers(render("--set", "dra.enabled=true")) == []


def test_binding_conditions_grant_the_claim_watch_and_status_writes_of_those_drivers_alone() -> None:
    """A DRA driver with binding_conditions (docs/dra.md, "Binding conditions") adds claims' list
    and watch, status updates, and status.devices of that driver alone (resourceclaims/driver on
    the claim's own node, 1.36 on); without one, claims stay get-only."""
    drivers = [
        {"name": "gpu.example.com", "resources": ["example.com/gpu"], "binding_conditions": True},
        {"name": "nic.example.com", "resources": ["example.com/nic"]},
    ]
    values = f"config.dra.drivers={json.dumps(drivers)}"
    rules = one(render("--set", "dra.enabled=true", "--set-json", values), "ClusterRole")["rules"]
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims"],
        "verbs": ["list", "watch"],
    } in rules
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/status"],
        "verbs": ["update"],
    } in rules
    assert {
        "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
        "resourceNames": ["gpu.example.com"], "verbs": ["associated-node:update"],
    } in rules  # fmt: skip
    plain = one(render("--set", "dra.enabled=true"), "ClusterRole")["rules"]
    assert [r["verbs"] for r in plain if "resourceclaims" in r["resources"]] == [["get"]]
    assert not [r for r in plain if {"resourceclaims/status", "resourceclaims/driver"} & set(r["resources"])]


def test_a_misspelt_value_fails_lint_and_render_naming_it() -> None:
    """values.schema.json: every value the chart reads, closed where the chart owns the keys."""
    typo = ("--set", "nodeSelectr.kubernetes\\.io/os=linux")
    assert "'nodeSelectr' not allowed" in helm_fails("template", RELEASE, str(CHART), *typo)
    linted = subprocess.run(
        [require_helm(), "lint", "--strict", str(CHART), *typo],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert linted.returncode != 0 and "'nodeSelectr' not allowed" in linted.stdout + linted.stderr


def test_the_chart_names_the_kubernetes_it_needs_and_dra_refuses_an_older_one() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["kubeVersion"] == ">=1.24.0-0"
    assert render("--kube-version", "1.24.0")  # the device plugin alone: fine
    refused = helm_fails(
        "template", RELEASE, str(CHART), "--kube-version", "1.29.0", "--set", "dra.enabled=true"
    )
    assert "dra.enabled needs Kubernetes 1.30 or newer" in refused
    render("--kube-version", "1.30.0", "--set", "dra.enabled=true")


def test_runtime_class_pod_security_context_and_probe_timings_reach_the_pod() -> None:
    docs = render(
        "--set", "runtimeClassName=nvidia",
        "--set", "podSecurityContext.fsGroup=44",
        "--set", "probes.startup.failureThreshold=90",
        "--set", "probes.readiness.periodSeconds=7",
    )  # fmt: skip
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia" and pod["securityContext"] == {"fsGroup": 44}
    container = devshim_container(one(docs, "DaemonSet"))
    healthz = {"path": "/healthz", "port": "ops"}
    assert container["startupProbe"] == {"httpGet": healthz, "periodSeconds": 2, "failureThreshold": 90}
    assert container["readinessProbe"]["periodSeconds"] == 7
    assert container["livenessProbe"]["failureThreshold"] == 3  # the rest as it was
    validate_all(docs)
    refused = helm_fails("template", RELEASE, str(CHART), "--set", "probes.liveness.periodSecond=5")
    assert "'periodSecond' not allowed" in refused


def test_a_device_class_per_dra_driver_when_asked() -> None:
    drivers = [
        {"name": n, "resources": [f"example.com/{i}"]}
        for i, n in enumerate(("gpu.example.com", "nic.example.com"))
    ]
    values = ("--set", "dra.enabled=true", "--set-json", f"config.dra.drivers={json.dumps(drivers)}")
    assert not [d for d in render(*values) if d["kind"] == "DeviceClass"]  # off by default
    docs = render(*values, "--set", "dra.deviceClasses=true")
    classes = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "DeviceClass"}
    assert classes == {
        n: {"selectors": [{"cel": {"expression": f'device.driver == "{n}"'}}]}
        for n in ("gpu.example.com", "nic.example.com")
    }
    validate_all(docs)


def test_namespace_override_moves_every_namespaced_object_and_the_policys_account() -> None:
    docs = render("--set", "namespaceOverride=accel", "--set", "dra.enabled=true")
    namespaced = [d for d in docs if d["kind"] in ("DaemonSet", "ConfigMap", "ServiceAccount")]
    assert len(namespaced) == 3 and {d["metadata"]["namespace"] for d in namespaced} == {"accel"}
    assert one(docs, "ClusterRoleBinding")["subjects"][0]["namespace"] == "accel"
    (condition,) = one(docs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert "system:serviceaccount:accel:" in condition["expression"]


def test_the_packaged_chart_renders_what_the_folder_does(tmp_path: Path) -> None:
    """`helm package` (docs/helm.md, "Package and host"): the archive, named for the chart's
    version, lints and renders the same objects as the folder, and carries its values schema."""
    out = helm("package", str(CHART), "--destination", str(tmp_path))
    archive = tmp_path / f"devshim-{PROJECT['version']}.tgz"
    assert archive.is_file() and str(archive) in out
    helm("lint", "--strict", str(archive))
    values = ("--values", str(VALUES["sim-driver.yaml"]))
    assert helm("template", RELEASE, str(archive), *values) == helm("template", RELEASE, str(CHART), *values)
    assert "'nodeSelectr' not allowed" in helm_fails(
        "template", RELEASE, str(archive), "--set", "nodeSelectr.a=b"
    )


def test_an_account_and_rbac_made_elsewhere_are_used_by_name() -> None:
    docs = render(
        "--set", "dra.enabled=true", "--set", "serviceAccount.create=false",
        "--set", "serviceAccount.name=gpu-publisher", "--set", "rbac.create=false",
    )  # fmt: skip
    kinds = {d["kind"] for d in docs}
    assert not {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} & kinds
    assert pod_spec(docs)["serviceAccountName"] == "gpu-publisher"
    (condition,) = one(docs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert condition["expression"].endswith(f':{NAMESPACE}:gpu-publisher"'), condition
    named = render("--set", "dra.enabled=true", "--set", "serviceAccount.name=gpu-publisher")
    assert one(named, "ServiceAccount")["metadata"]["name"] == "gpu-publisher"
    assert one(named, "ClusterRoleBinding")["subjects"][0]["name"] == "gpu-publisher"


def test_node_configs_render_each_named_config_where_the_label_finds_it(
    tmp_path: Path, no_devshim_env: None
) -> None:
    """examples/helm/node-configs.yaml: config.yaml says which label chooses and where the named
    configs are; each is in the pods' nodes/ folder, and devshim's own chooser (shim/nodeconfig.py)
    loads it as `config` with the named keys in their place; the pods read their Node's label as
    the account the ClusterRole lets get, list and watch nodes, with NODE_NAME and their token."""
    values = values_file("node-configs.yaml")
    docs = render_file("node-configs.yaml")
    settings, folder, mount = loaded_settings(docs, tmp_path)
    chooser = settings.node_configs
    assert chooser is not None and chooser.label == "devshim.dev/config" and chooser.wait_s == 30
    nodes = folder / chooser.folder.relative_to(mount["mountPath"])
    assert sorted(p.stem for p in nodes.iterdir()) == sorted(values["nodeConfigs"]["configs"])
    configs = NodeConfigs(chooser.model_copy(update={"folder": nodes}), folder / "config.yaml", Settings.load)
    for name, named in values["nodeConfigs"]["configs"].items():
        configs.name = name
        loaded = configs.load()
        assert [r.model_dump(exclude_unset=True) for r in loaded.resources] == named["resources"], name
        assert loaded.log_level == named.get("log_level", settings.log_level), name
        kept = settings.model_dump(exclude={"resources", "log_level", "node_configs"})
        assert loaded.model_dump(exclude={"resources", "log_level", "node_configs"}) == kept, name
    pod = pod_spec(docs)
    container = devshim_container(one(docs, "DaemonSet"))
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container[
        "env"
    ]
    assert "api-token" in {m["name"] for m in container["volumeMounts"]}
    role = one(docs, "ClusterRole", f"{RELEASE}-node-configs")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    binding = one(docs, "ClusterRoleBinding", f"{RELEASE}-node-configs")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    ]
    assert one(docs, "ServiceAccount")["metadata"]["name"] == pod["serviceAccountName"]
    validate_all(docs)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--set-json", 'nodeConfigs.configs={"a/b": {}}'], "invalid propertyName 'a/b'"),
        (["--set", "nodeConfigs.configs.big.state_dir=/x"], "'state_dir' not allowed"),
        (["--set", "nodeConfigs.label=not a label"], "at '/nodeConfigs/label': 'not a label' does not match"),
        (["--set", "config.node_configs.label=x"], "config.node_configs is set from nodeConfigs"),
    ],
)
def test_node_configs_a_node_could_not_switch_to_fail_the_render(flags: list[str], message: str) -> None:
    """A name no label value can hold, a named key a switch cannot apply (restart-only), a label
    key Kubernetes refuses, the chooser written by hand: each refused, saying which."""
    assert message in helm_fails("template", RELEASE, str(CHART), *flags)


def test_without_node_configs_the_pods_read_no_label() -> None:
    docs = render()
    assert "node_configs" not in _parsed_config(one(docs, "ConfigMap"))
    assert "items" not in volumes(one(docs, "DaemonSet"))["config"]["configMap"]
    assert not any(d["kind"].startswith("ClusterRole") for d in docs)

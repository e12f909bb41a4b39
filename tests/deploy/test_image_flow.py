"""From zero to a driver on a cluster, as docs/operations.md writes it: the kustomization that sets
the pushed image, node selection, the test pod, and deploy/examples/vendor-driver (an image of
one's own FROM devshim's with a Node.js driver). What can run here runs: rendering, strict
offline validation, hadolint, and the vendor's driver behind devshim with the example's config."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]
import yaml

from tests.deploy.test_manifests import devshim_container, one, render, validate_strictly
from tests.deploy.tools import DEPLOY, ROOT, require_tool
from tests.support.compat_cell import run_cell
from tests.support.devshim_process import DEVSHIM
from tests.support.toolchains import toolchain

OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
VENDOR = DEPLOY / "examples" / "vendor-driver"


def documented_kustomization(tmp_path: Path) -> Path:
    """The kustomization docs/operations.md writes in step 2, in a directory of its own beside a
    link to deploy/ (it names ../deploy/overlays/...), as a reader's checkout has it."""
    body = OPERATIONS.split("<<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    (tmp_path / "deploy").symlink_to(DEPLOY)
    mine = tmp_path / "my-devshim"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(body + "\n")
    return mine


def test_the_documented_kustomization_runs_the_pushed_image(tmp_path: Path) -> None:
    """Following the docs ends with the image just pushed, not a bare devshim:0.1.0 no registry has."""
    docs = render(documented_kustomization(tmp_path))
    version = kubernetes_validate.latest_version()
    for doc in docs:
        validate_strictly(doc, version)
    image = devshim_container(one(docs, "DaemonSet"))["image"]
    assert "docker build -t registry.example/devshim:0.1.0 ." in OPERATIONS
    assert image == "registry.example/devshim:0.1.0"


def test_the_documented_node_selection_patch_selects_nodes(tmp_path: Path) -> None:
    patch = OPERATIONS.split("**Only some nodes.**", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    mine = documented_kustomization(tmp_path)
    kustomization = yaml.safe_load((mine / "kustomization.yaml").read_text()) | yaml.safe_load(patch)
    (mine / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    pod = one(render(mine), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["feature.node.kubernetes.io/pci-10de.present"] == "true"


def test_the_test_pod_asks_for_what_the_sim_demo_serves() -> None:
    (pod,) = yaml.safe_load_all((DEPLOY / "examples" / "test-pod.yaml").read_text())
    validate_strictly(pod, kubernetes_validate.latest_version())
    sim = yaml.safe_load((DEPLOY / "overlays" / "sim-demo" / "sim.yaml").read_text())
    (limits,) = [c["resources"]["limits"] for c in pod["spec"]["containers"]]
    assert set(limits) == {r["name"] for r in sim["resources"]}
    assert f"kubectl logs {pod['metadata']['name']}" in OPERATIONS


def test_the_vendor_dockerfile_lints_clean_and_installs_what_the_config_runs(tmp_path: Path) -> None:
    hadolint = require_tool("hadolint")
    dockerfile = VENDOR / "Dockerfile"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    linted = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(dockerfile)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert (linted.returncode, linted.stdout + linted.stderr) == (0, "")
    text = dockerfile.read_text()
    (copy,) = re.findall(r"^COPY (\S+) (\S+)$", text, re.MULTILINE)
    (driver,) = yaml.safe_load((VENDOR / "config.yaml").read_text())["drivers"]
    assert driver["command"] == ["/usr/bin/node", copy[1]]  # the interpreter named outright
    assert (ROOT / copy[0]).is_file() and "install -y --no-install-recommends nodejs" in text
    assert one(render(VENDOR), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example/devshim-vendor:0.1.0"
    )


def test_the_vendor_driver_passes_compat_with_the_examples_config(tmp_path: Path) -> None:
    """The example's config as devshim runs it in the image (env, its declared grant policy), with the
    image's paths mapped to this checkout's: the allocate row passes, showing the grant."""
    toolchain("node", "the Node.js example driver (adapters/examples/node)")
    node = shutil.which("node")
    assert node is not None
    settings = yaml.safe_load((VENDOR / "config.yaml").read_text())
    (driver,) = settings["drivers"]
    driver["command"] = [node, str(ROOT / "adapters" / "examples" / "node" / "driver.js")]
    mapped = tmp_path / "config.yaml"
    mapped.write_text(yaml.safe_dump({"drivers": [driver]}))
    outcome = run_cell(tmp_path, "allocate", "--config", str(mapped))
    assert (outcome.code, outcome.status) == (0, "pass"), outcome
    assert outcome.reason.startswith("example.com/node node-0: ")


def test_the_examples_config_loads() -> None:
    """check-config on it as an operator would, from the repository root (node is not at
    /usr/bin/node on every machine: a warning there, never an error)."""
    path = "deploy/examples/vendor-driver/config.yaml"
    checked = subprocess.run([*DEVSHIM, "check-config", path], cwd=ROOT, capture_output=True, text=True)
    assert checked.returncode == 0 and "serves driver vendor" in checked.stdout, checked.stderr

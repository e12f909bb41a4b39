"""The Dockerfile: linted by hadolint at its strictest, and its install steps (deploy/install.sh)
replayed into a fresh venv from the build context .dockerignore lets through."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shim
from scripts.dockerfile import DockerIgnore, copy_build_context
from tests.deploy.tools import PROJECT, ROOT, require_tool

DOCKERFILE = ROOT / "Dockerfile"
# Every label is required in these formats, and no other label is allowed (--strict-labels).
LABELS = {
    "org.opencontainers.image.title": "text",
    "org.opencontainers.image.description": "text",
    "org.opencontainers.image.version": "semver",
    "org.opencontainers.image.licenses": "spdx",
    "org.opencontainers.image.source": "url",
}


def instructions(keyword: str) -> list[str]:
    """The arguments of every KEYWORD instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text(encoding="utf-8"))
    return [m.group(1).strip() for m in re.finditer(rf"^{keyword}\s+(.*)$", text, re.MULTILINE)]


def test_hadolint_finds_nothing(tmp_path: Path) -> None:
    """No finding at any severity; run away from any hadolint config (cwd, HOME, XDG) that
    could ignore rules, so only the Dockerfile's own justified pragmas apply."""
    hadolint = require_tool("hadolint")
    labels = [arg for label, form in LABELS.items() for arg in ("--require-label", f"{label}:{form}")]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", "--strict-labels", *labels, str(DOCKERFILE)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_only_the_root_user_rule_is_ignored() -> None:
    """DL3002 (last USER is root) is the one deliberate exception: a device plugin writes to the
    kubelet's root-owned directories. Any other ignore needs a reason and an update here."""
    ignored = re.findall(r"#\s*hadolint\s+ignore=(\S+)", DOCKERFILE.read_text(encoding="utf-8"))
    assert ignored == ["DL3002"]


def test_image_runs_devshim_with_the_mounted_config_and_exposes_the_ops_port() -> None:
    assert [json.loads(arg) for arg in instructions("ENTRYPOINT")] == [["devshim"]]
    assert [json.loads(arg) for arg in instructions("CMD")] == [
        ["run", "--config", "/etc/devshim/config.yaml"]
    ]
    assert instructions("EXPOSE") == ["9477"]
    label_text = " ".join(instructions("LABEL"))
    assert f'org.opencontainers.image.version="{PROJECT["version"]}"' in label_text


def test_the_image_installs_with_deploy_install_sh_and_keeps_only_its_venv() -> None:
    """The script the install test replays is the one the build stage runs, and the final
    stage takes that venv and puts its bin/ first on PATH."""
    runs = [arg for arg in instructions("RUN") if "deploy/install.sh" in arg]
    assert len(runs) == 1, instructions("RUN")
    venv = runs[0].split("deploy/install.sh", 1)[1].split()[0]
    assert f"--from=build {venv} {venv}" in instructions("COPY")
    assert any(arg.startswith(f'PATH="{venv}/bin:') for arg in instructions("ENV"))


# --- the build context and the install (scripts/dockerfile.py emulates .dockerignore) ---------


def test_dockerignore_semantics_as_emulated() -> None:
    """The emulation agrees with Docker on the cases this .dockerignore relies on."""
    ignore = DockerIgnore("*\n!src\n!tests/compat/peer\n**/__pycache__\n")
    assert ignore.excluded(".git/config") and ignore.excluded("docs/a.md")
    assert not ignore.excluded("src/shim/cli.py")
    assert not ignore.excluded("tests/compat/peer/wire.py")
    assert ignore.excluded("tests/compat/test_x.py")
    assert ignore.excluded("src/shim/__pycache__/cli.cpython-311.pyc")
    assert ignore.may_reinclude_below("tests") and not ignore.may_reinclude_below("tests/unit")


@pytest.mark.full_matrix  # 22 s of the default suite's 15 minutes: with --full-matrix, and by hand
@pytest.mark.timeout(300)
def test_install_script_builds_a_working_non_editable_install(tmp_path: Path) -> None:
    """What the build stage does, in a temp dir: the wheel built from the filtered build
    context (so .dockerignore keeps everything the wheel needs), installed into a fresh venv;
    then devshim, its drivers and the packages `devshim demo`/`compat` need all work from it."""
    require_tool("hadolint")  # the Dockerfile checks run where the deployment tools are installed
    context, venv = tmp_path / "context", tmp_path / "venv"
    context.mkdir()
    top = copy_build_context(context)
    assert ".git" not in top and "docs" not in top, top
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHON"] = sys.executable  # creates the venv, like the image's python3
    install = subprocess.run(
        ["sh", str(context / "deploy" / "install.sh"), str(venv), str(context)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=280,
    )
    assert install.returncode == 0, install.stderr[-4000:]

    def run(*argv: str) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stdout

    assert run(str(venv / "bin" / "devshim"), "version").startswith(f"devshim {PROJECT['version']} ")
    where = run(
        str(venv / "bin" / "python"),
        "-c",
        "import devshim_adapters.sim, shim.compat.fakekubelet, shim.compat, shim; print(shim.__file__)",
    )
    # Installed into the venv, not pointing back at a source tree (an editable install would).
    assert Path(where.strip()).is_relative_to(venv), where
    # The shipped configs run drivers as /opt/devshim/bin/<script>: every script is there.
    missing = [name for name in PROJECT["scripts"] if not (venv / "bin" / name).exists()]
    assert not missing


def test_the_go_fpga_example_image_is_linted_too_and_builds_on_this_devshim(tmp_path: Path) -> None:
    """examples/go-fpga/Dockerfile, the recipe a vendor copies: no hadolint finding at any
    severity, and the devshim image it builds on is tagged with this devshim's version."""
    example = DOCKERFILE.parent / "examples" / "go-fpga" / "Dockerfile"
    hadolint = require_tool("hadolint")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(example)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    assert f"ARG DEVSHIM_VERSION={shim.__version__}\n" in example.read_text(encoding="utf-8")

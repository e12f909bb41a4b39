"""The image scripts/build_image.py builds without Docker, checked against the Dockerfile.

No Docker engine runs here, so the image `docker build` would make cannot be listed beside it.
What makes the two the same instead, and what these tests check so that it can fail:

- the builder keeps no recipe of its own: it carries out the Dockerfile's instructions (an
  instruction it does not implement is an error), so the steps cannot drift apart;
- the files that matter, the venv at /opt/devshim, are listed in the image and compared with
  deploy/install.sh replayed into a fresh venv by Debian's python3 (the image's interpreter),
  with the Dockerfile's ENV and the image's resolved versions as pip constraints (PyPI moving on
  between the two installs is not a difference between the two builds);
- the base is what the Dockerfile installs: its pinned packages at their pins, every other
  package added by apt a dependency of them (no recommends), no apt lists or caches, no /src;
- the image config (Entrypoint, Cmd, Env, Labels, ExposedPorts, User) equals the Dockerfile's
  instructions as test_dockerfile.py reads them, independently of the builder's parser.

The base itself is a debootstrap minbase of the suite, where Docker's is Debian's
debian:<suite>-slim, built the same way (docs/operations.md says what may differ). Building the
image costs about a minute and a half cold (then cached): the tests that need it run with
--full-matrix; the builder's parsing and cache key run in every run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts import build_image, dockerfile
from tests.deploy.test_dockerfile import instructions
from tests.deploy.tools import ROOT, require_image

DEBIAN_PYTHON = Path("/usr/bin/python3")


def test_the_builder_takes_the_dockerfiles_stages_and_refuses_what_it_cannot_do() -> None:
    stages = dockerfile.stages(dockerfile.DOCKERFILE.read_text(encoding="utf-8"))
    assert [s.name for s in stages] == ["base", "build", "2"]
    assert build_image.suite_of(stages[0].base) == "bookworm" and stages[1].base == stages[2].base == "base"
    with pytest.raises(dockerfile.DockerfileError, match="ADD"):
        dockerfile.stages("FROM debian:bookworm-slim\nADD x /x\n")
    with pytest.raises(dockerfile.DockerfileError, match="only debian"):
        build_image.suite_of("python:3.11-slim")


def test_the_cache_key_follows_the_build_context_and_nothing_else(tmp_path: Path) -> None:
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    (tmp_path / "docs").mkdir()
    key = build_image.inputs_key(tmp_path)
    (tmp_path / "docs" / "x.md").write_text("not in the build context\n")
    assert build_image.inputs_key(tmp_path) == key
    (tmp_path / "src" / "a.py").write_text("a = 2\n")
    assert build_image.inputs_key(tmp_path) != key


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The image's one layer, unpacked."""
    archive, root = require_image(), tmp_path_factory.mktemp("image") / "root"
    with tarfile.open(archive) as outer:
        manifest = _blob(outer, _member(outer, "index.json")["manifests"][0]["digest"])
        (layer,) = manifest["layers"]
        outer.extract(f"blobs/sha256/{layer['digest'].removeprefix('sha256:')}", root.parent, filter="tar")
    with tarfile.open(root.parent / "blobs/sha256" / layer["digest"].removeprefix("sha256:")) as tar:
        tar.extractall(root, filter="fully_trusted")
    yield root
    shutil.rmtree(root.parent, ignore_errors=True)


def _member(tar: tarfile.TarFile, name: str) -> Any:
    found = tar.extractfile(name)
    assert found is not None, name
    return json.load(found)


def _blob(tar: tarfile.TarFile, digest: str) -> Any:
    return _member(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}")


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.mark.full_matrix
@pytest.mark.timeout(600)
def test_the_image_config_is_the_dockerfiles() -> None:
    with tarfile.open(require_image()) as outer:
        index = _member(outer, "index.json")
        manifest = _blob(outer, index["manifests"][0]["digest"])
        config = _blob(outer, manifest["config"]["digest"])["config"]
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == build_image.image_name()
    assert config["Entrypoint"] == json.loads(instructions("ENTRYPOINT")[-1])
    assert config["Cmd"] == json.loads(instructions("CMD")[-1])
    assert config["ExposedPorts"] == {f"{port}/tcp": {} for port in instructions("EXPOSE")}
    assert config["User"] == instructions("USER")[-1]
    labels = dict(w.split("=", 1) for args in instructions("LABEL") for w in shlex.split(args))
    assert config["Labels"] == labels
    env = dict(v.split("=", 1) for v in config["Env"])
    for args in instructions("ENV"):
        for key, value in (w.split("=", 1) for w in shlex.split(args)):
            assert env[key] == value.replace("${PATH}", dockerfile.DEFAULT_PATH), key


@pytest.mark.full_matrix
@pytest.mark.timeout(600)
def test_the_base_holds_the_pinned_packages_and_their_dependencies_only(rootfs: Path) -> None:
    pins = dict(p.split("=") for p in re.findall(r"(\S+=\S+)", " ".join(instructions("RUN")))
                if not p.startswith("--"))  # fmt: skip
    status = _dpkg_status(rootfs / "var/lib/dpkg/status")
    assert {name: status[name]["Version"] for name in pins} == pins
    auto = set(re.findall(r"^Package: (\S+)\n(?:.+\n)*?Auto-Installed: 1$",
                          (rootfs / "var/lib/apt/extended_states").read_text(), re.MULTILINE))  # fmt: skip
    needed, todo = set(), list(pins)
    while todo:
        name = todo.pop()
        for group in re.split(
            r",\s*", status[name].get("Depends", "") + ", " + status[name].get("Pre-Depends", "")
        ):
            for alternative in filter(
                None, (a.split()[0].split(":")[0] for a in group.split("|") if a.strip())
            ):
                if alternative in status and alternative not in needed:
                    needed.add(alternative)
                    todo.append(alternative)
                    break
    assert auto and auto <= needed, sorted(auto - needed)
    assert not (rootfs / "src").exists()
    assert not [p for p in (rootfs / "var/lib/apt/lists").iterdir() if p.name != "partial"]
    assert not list((rootfs / "var/cache/apt").rglob("*.deb")) and not list(
        (rootfs / "var/cache/apt").glob("*.bin")
    )


def _dpkg_status(path: Path) -> dict[str, dict[str, str]]:
    packages = {}
    for block in path.read_text().split("\n\n"):
        fields = dict(re.findall(r"^(\S+): (.*)$", block, re.MULTILINE))
        if fields.get("Status", "").endswith(" installed"):
            packages[fields["Package"]] = fields
    return packages


@pytest.mark.full_matrix
@pytest.mark.timeout(600)
def test_the_images_venv_is_what_install_sh_makes_and_devshim_runs_in_it(
    rootfs: Path, tmp_path: Path
) -> None:
    if not (DEBIAN_PYTHON.is_file() and subprocess.run([DEBIAN_PYTHON, "-m", "venv", "-h"],
                                                       capture_output=True).returncode == 0):  # fmt: skip
        pytest.skip("Debian's python3 with python3-venv (the image's interpreter) is not installed here")
    venv = rootfs / "opt/devshim"
    site = next((venv / "lib").glob("python3.*/site-packages"))
    versions = [re.fullmatch(r"(.+)-([^-]+)\.dist-info", d.name) for d in site.glob("*.dist-info")]
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(
        "".join(f"{m[1]}=={m[2]}\n" for m in versions if m and m[1] not in ("devshim", "pip", "setuptools"))
    )
    context, replay = tmp_path / "context", tmp_path / "venv"
    context.mkdir()
    dockerfile.copy_build_context(context)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    build_env: dict[str, str] = {}  # the build stage's ENV, from the Dockerfile
    for args in instructions("ENV"):
        build_env |= {k: v for k, v in (w.split("=", 1) for w in shlex.split(args)) if k != "PATH"}
    env |= {**build_env, "PYTHON": str(DEBIAN_PYTHON), "PIP_CONSTRAINT": str(constraints)}
    env.pop("PIP_FIND_LINKS", None)
    done = subprocess.run(["sh", str(context / "deploy/install.sh"), str(replay), str(context)],
                          capture_output=True, text=True, env=env, timeout=500)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert _files(venv) == _files(replay)
    argv = [shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs), "/opt/devshim/bin/devshim", "version"]
    version = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert version.returncode == 0 and version.stdout.startswith("devshim "), version.stderr

"""The deployment checks' external tools (hadolint, kubectl, helm), the image built without Docker, and
project facts they compare with."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

from scripts import build_helm, build_image
from tests.support.toolchains import unavailable

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def require_tool(name: str) -> str:
    """The tool's path: the one installed beside this Python (the test extras), else on PATH.
    Missing: a skip, or a failure under CI (tests/support/toolchains.py)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        unavailable(f"{name} is not installed (pip install -e '.[test]' installs it)")
    return found


def require_helm() -> str:
    """The pinned helm (scripts/build_helm.py), which `.ci/run` builds before the tests; by hand:
    `python -m scripts.build_helm`. Not built: a skip, or a failure under CI."""
    if not build_helm.built():
        unavailable(
            f"helm {build_helm.HELM_VERSION} is not built at {build_helm.helm_path()}: "
            "`python -m scripts.build_helm` builds it (about 3 minutes with cold Go caches)"
        )
    return str(build_helm.helm_path())


def require_image() -> Path:
    """devshim's image as an OCI archive (scripts/build_image.py): cached, or built now (about a
    minute and a half: debootstrap, apt and pip). Without root or debootstrap: a skip, or a
    failure under CI."""
    if os.geteuid() != 0:
        unavailable("building the image without Docker needs root (debootstrap, chroot, mount)")
    if shutil.which("debootstrap") is None and not build_image.cached_path().is_file():
        unavailable("debootstrap is not installed (Debian: apt-get install debootstrap)")
    return build_image.build()

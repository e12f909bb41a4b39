"""The deployment checks' external tools (hadolint, kubectl) and project facts they compare with."""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

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

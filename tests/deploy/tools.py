"""The deployment checks' external tools (hadolint, kubectl) and project facts they compare with."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# CI sets this, so a missing tool fails there instead of silently skipping the checks.
REQUIRE_ENV = "DEVSHIM_REQUIRE_DEPLOY_TOOLS"


def require_tool(name: str) -> str:
    """The tool's path: the one installed beside this Python (the test extras), else on PATH.
    Missing: a skip, or a failure when DEVSHIM_REQUIRE_DEPLOY_TOOLS=1."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        message = f"{name} is not installed (pip install -e '.[test]' installs it)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{message}, and {REQUIRE_ENV}=1 requires it")
        pytest.skip(message)
    return found

"""The tools beside Python that some tests need: Node.js, Go (README.md, Tests) and the deployment
checks' hadolint and kubectl (tests/deploy).

Where one is missing its tests skip, except under CI: `.ci/run` sets DEVSHIM_REQUIRE_TOOLS=1, and
then a missing tool fails those tests loudly instead of passing a run that never ran them.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

REQUIRE_ENV = "DEVSHIM_REQUIRE_TOOLS"


def unavailable(message: str) -> NoReturn:
    """Skip the test for a missing tool, or fail it when CI requires every tool."""
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message}, and {REQUIRE_ENV}=1 requires it")
    pytest.skip(message)


def toolchain(command: str, needed_for: str) -> str:
    """The path of `command` on PATH, or unavailable()."""
    path = shutil.which(command)
    if path is None:
        unavailable(f"no `{command}` on PATH: {needed_for} needs it (README.md, Tests)")
    return path

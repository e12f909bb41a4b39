"""`devshim compat` run as a process on one cell: what tests of a single row need."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.devshim_process import DEVSHIM


def one_cell(scenario: str) -> list[str]:
    """The flags that select SCENARIO's cell on the newest kubelet, v1beta1, classic registration."""
    return ["--scenario", scenario, "--profile", "next", "--kubelet", "v1beta1", "--registration", "classic"]


@dataclass(frozen=True)
class Cell:
    code: int  # devshim compat's exit status
    status: str  # the cell's: pass, fail or skip
    reason: str  # why it failed or skipped, or what a pass saw
    seconds: float
    stdout: str
    stderr: str


def run_cell(
    tmp_path: Path,
    scenario: str,
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Cell:
    """`devshim compat ARGS` on SCENARIO's one cell, read back from its JSON report."""
    report = tmp_path / f"compat-{scenario}.json"
    result = subprocess.run(
        [*DEVSHIM, "compat", *args, *one_cell(scenario), "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=None if env is None else dict(env),
    )
    assert "Traceback" not in result.stderr, result.stderr
    (cell,) = json.loads(report.read_text())["cells"]
    found: dict[str, Any] = cell
    return Cell(
        result.returncode, found["status"], found["reason"], found["seconds"], result.stdout, result.stderr
    )

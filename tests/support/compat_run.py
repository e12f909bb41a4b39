"""`devshim compat` as a real process, its table, JSON and JUnit read back and checked to agree."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.devshim_process import DEVSHIM


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str
    cells: list[dict[str, Any]]
    summary: dict[str, int]

    def by_status(self, status: str) -> dict[tuple[str, str], str]:
        """(scenario, mode) -> reason, for the cells that ended in `status`."""
        return {(c["scenario"], c["mode"]): c["reason"] for c in self.cells if c["status"] == status}


def compat(tmp_path: Path, *args: str, cwd: Path | None = None) -> Run:
    """`devshim compat ARGS --json --junit` (in ``cwd``); the JUnit file and the table's summary
    line must agree with the JSON, cell by cell."""
    report, junit = tmp_path / "compat.json", tmp_path / "compat.xml"
    result = subprocess.run(
        [*DEVSHIM, "compat", *args, "--json", str(report), "--junit", str(junit)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )
    assert "Traceback" not in result.stderr, result.stderr
    document = json.loads(report.read_text())
    cells = document["cells"]
    suite = ET.parse(junit).getroot()
    assert {k: int(suite.get(k, "-1")) for k in ("tests", "failures", "skipped")} == {
        "tests": len(cells),
        "failures": document["summary"]["fail"],
        "skipped": document["summary"]["skip"],
    }
    outcomes: dict[str, tuple[str, str]] = {}
    for case in suite.iter("testcase"):
        marks = [(m.tag, m.get("message", "")) for m in case if m.tag in ("failure", "skipped")]
        seen = "".join(m.text or "" for m in case if m.tag == "system-out")  # what a pass saw
        outcomes[case.get("name", "")] = marks[0] if marks else ("pass", seen)
    status = {"pass": "pass", "failure": "fail", "skipped": "skip"}
    assert {n: (status[tag], why) for n, (tag, why) in outcomes.items()} == {
        f"{c['scenario']}[{c['mode']}]": (c["status"], c["reason"]) for c in cells
    }
    line = re.search(r"^(\d+) cells run: (\d+) passed, (\d+) failed, (\d+) skipped$", result.stdout, re.M)
    assert line is not None, result.stdout
    summary = document["summary"]
    assert [int(n) for n in line.groups()] == [len(cells), summary["pass"], summary["fail"], summary["skip"]]
    return Run(result.returncode, result.stdout, result.stderr, cells, summary)


def table_row(stdout: str, scenario: str) -> str:
    lines = [line for line in stdout.splitlines() if line.split(" ", 1)[0] == scenario]
    assert len(lines) == 1, stdout
    return lines[0]

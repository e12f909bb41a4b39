"""`python -m bench` still runs: one cheap row, --quick; checks the JSON's shape, never its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
FIELDS = {"name", "baseline", "devshim", "value", "goal", "met", "by", "note", "extra"}


def test_quick_row_writes_every_field(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [sys.executable, "-m", "bench", "--quick", "--rows", "reregister", "--json", str(out)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["quick"] is True
    (row,) = document["rows"]
    assert set(row) == FIELDS
    assert row["extra"]["row"] == "reregister"
    assert row["met"] in (True, False), row["note"]
    assert {"p50_ms", "p99_ms"} <= set(row["devshim"]) and {"p50_ms", "p99_ms"} <= set(row["baseline"])
    assert "| kubelet restart" in done.stdout

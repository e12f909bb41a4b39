"""The Go FPGA example (examples/go-fpga) through `devshim compat`, as a vendor would judge it,
with its own devshim.yaml (grant policy, env, the DRA pool) and a health hook that drops a fault
report. By default the allocate and health rows of one kubelet profile; with --full-matrix the
whole --quick matrix and --dra."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.builds import EXAMPLE

HOOK = 'echo fault > "$FPGA_REPORTS/$DEVSHIM_COMPAT_DEVICE"'


@pytest.fixture
def reports() -> Iterator[Path]:
    """The folder fault reports are dropped in: the driver runs as nobody under compat, and
    takes (removes) each report, so nobody may write there (pytest's tmp_path is root's alone)."""
    with tempfile.TemporaryDirectory(prefix="ds-fpga-") as folder:
        Path(folder).chmod(0o777)
        yield Path(folder)


def settings(tmp_path: Path, binary: Path, reports: Path) -> Path:
    """examples/go-fpga/devshim.yaml with the built binary and this test's report folder."""
    text = (EXAMPLE / "devshim.yaml").read_text()
    text = text.replace("/usr/local/bin/go-fpga", str(binary)).replace("/run/fpga-reports", str(reports))
    text = text.replace("/var/run/cdi", str(tmp_path / "cdi"))
    config = tmp_path / "devshim.yaml"
    config.write_text(text)
    return config


def compat(config: Path, reports: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FPGA_REPORTS": str(reports), "NODE_NAME": "node-1"}
    command = [sys.executable, "-m", "shim", "compat", "--config", str(config), "--health-hook", HOOK, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_the_go_example_passes_compat_allocate_and_health(
    tmp_path: Path, go_programs: dict[str, Path], reports: Path
) -> None:
    """Its grant (env, device node, CDI name resolved in the spec it ships) and its health flip
    reach the fake kubelet."""
    config = settings(tmp_path, go_programs["go-fpga"], reports)
    done = compat(config, reports, "--profile", "1.33+", "--scenario", "allocate", "--scenario",
                  "health_change", "--scenario", "preferred_allocation", timeout_s=240)  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "0 failed" in done.stdout and "cdi example.com/fpga=fpga-0" in done.stdout


@pytest.mark.full_matrix
@pytest.mark.parametrize("mode", [["--quick"], ["--dra"]], ids=["device-plugin", "dra"])
def test_the_go_example_passes_the_whole_compat_matrix(
    tmp_path: Path, go_programs: dict[str, Path], reports: Path, mode: list[str]
) -> None:
    """`devshim compat --quick` and `--dra`: every cell that applies passes."""
    config = settings(tmp_path, go_programs["go-fpga"], reports)
    done = compat(config, reports, *mode, timeout_s=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

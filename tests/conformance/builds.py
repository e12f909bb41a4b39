"""The Go programs the conformance suite and the bench run: the Go SDK's conformance fixture
and the Go FPGA example, built with the machine's Go (no dependencies beyond the SDK itself, so
no module downloads; Go's build cache makes a second build take about a second)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk" / "go"
EXAMPLE = ROOT / "examples" / "go-fpga"
# (module folder, package within it, binary name)
PROGRAMS = {
    "go-fixture": (SDK, "./internal/fixture"),
    "go-fpga": (EXAMPLE, "."),
}


def build(name: str, out_dir: Path, timeout_s: float = 300) -> Path:
    """Build program ``name`` into ``out_dir``; CalledProcessError carries Go's own words."""
    module, package = PROGRAMS[name]
    binary = out_dir / name
    # As the project's other Go code (tests/support/legacy_plugins/go/build.sh): the module alone,
    # go.mod the pin, no paths or VCS stamps of this checkout in the binary.
    env = {**os.environ, "GOWORK": "off", "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}
    subprocess.run(
        ["go", "build", "-trimpath", "-buildvcs=false", "-o", str(binary), package],
        cwd=module, env=env, check=True, timeout=timeout_s, capture_output=True,
    )  # fmt: skip
    return binary

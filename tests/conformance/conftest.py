"""Fixtures of the conformance suite: every driver implementation, as a command to run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.builds import ROOT, built
from tests.support.toolchains import toolchain, unavailable


@pytest.fixture(scope="session")
def go_programs() -> Iterator[dict[str, Path]]:
    """The Go fixture and the Go FPGA example, built unless the cache holds them (prebuild builds
    them ahead of the tests), copied where the user devshim runs drivers as (nobody) can run them."""
    toolchain("go", "the Go SDK (sdk/go) and its example (examples/go-fpga)")
    with tempfile.TemporaryDirectory(prefix="ds-gosdk-") as out:
        Path(out).chmod(0o755)
        try:
            programs = {
                name: Path(shutil.copy(built(name), Path(out) / name)) for name in ("go-fixture", "go-fpga")
            }
        except subprocess.CalledProcessError as exc:
            pytest.fail(f"go build failed:\n{exc.stderr.decode(errors='replace')}")
        for binary in programs.values():
            binary.chmod(0o755)
        yield programs


# The simulated driver serving one per-call resource (its grants made per call, as the vectors'
# allocate steps need).
SIM_CONFIG = {
    "resources": [
        {"name": "example.com/sim", "count": 3, "id_prefix": "sim-", "grant_mode": "per_call",
         "grant": {"envs": {"SIM_DEVICES": "{ids}"}}},
    ]
}  # fmt: skip

# Each implementation: whether it is one of the SDK fixtures (vectors/fixture.json too).
DRIVERS = {"python-sdk": True, "go-sdk": True, "go-fpga": False, "node": False, "sim": False}


def driver_command(name: str, go: dict[str, Path] | None) -> list[str]:
    if name == "python-sdk":
        return [sys.executable, str(ROOT / "tests" / "conformance" / "drivers" / "fixture.py")]
    if name == "sim":
        return [sys.executable, "-m", "devshim_adapters.sim", "--config-json", json.dumps(SIM_CONFIG)]
    if name == "node":
        node = shutil.which("node") or unavailable("no `node` on PATH: the Node.js example needs it")
        return [node, str(ROOT / "adapters" / "examples" / "node" / "driver.js")]
    assert go is not None
    return [str(go["go-fixture" if name == "go-sdk" else name])]

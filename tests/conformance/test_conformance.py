"""Every driver implementation through the language-neutral vectors (README.md here).

The Python SDK and the Go SDK (each through the same fixture driver), the Go FPGA example, the
Node.js example and the simulated driver each run every generic vector as a real subprocess; the
two SDK fixtures also run vectors/fixture.json, exact answers and notifications. A protocol change
that one of them does not follow fails here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conformance.conftest import DRIVERS, driver_command
from tests.conformance.runner import run_vector, vector_files

GENERIC = [v for v in vector_files() if v != "fixture"]
CASES = [
    pytest.param(driver, vector, id=f"{driver}-{vector}")
    for driver, is_fixture in DRIVERS.items()
    for vector in (*GENERIC, *(["fixture"] if is_fixture else []))
]


@pytest.mark.parametrize(("driver", "vector"), CASES)
async def test_the_driver_answers_the_vector_as_written(
    driver: str, vector: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each step's answer, notifications and exit status are exactly what the vector says."""
    go = request.getfixturevalue("go_programs") if driver.startswith("go-") else None
    command = driver_command(driver, go)
    # A driver gets only the environment devshim would give it, plus what finds the interpreter.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    stderr = tmp_path / "stderr.log"
    try:
        await run_vector(command, vector, env, stderr)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n--- the driver's stderr:\n{stderr.read_text(errors='replace')[-4000:]}"
        ) from None

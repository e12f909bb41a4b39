"""The Go SDK's own checks, in the default suite: its unit tests, go vet and gofmt, and its message
types generated fresh from the schema (a proto change that is not regenerated fails here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.builds import EXAMPLE, ROOT, SDK
from tests.support.toolchains import toolchain

GO_ENV = {**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=readonly"}


@pytest.fixture(autouse=True, scope="module")
def _go_present() -> None:
    toolchain("go", "the Go SDK (sdk/go)")


def go(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["go", *args], cwd=cwd, env=GO_ENV, capture_output=True, text=True, timeout=300)


def test_the_go_sdks_unit_tests_pass() -> None:
    """`go test ./...` in sdk/go: framing, concurrency, cancellation, stdout ownership, the reader."""
    done = go("test", "-count=1", "./...", cwd=SDK)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("module", [SDK, EXAMPLE], ids=["sdk", "example"])
def test_go_vet_and_gofmt_are_clean(module: Path) -> None:
    """Every exported name documented is vet's and review's; formatting is gofmt's."""
    vet = go("vet", "./...", cwd=module)
    assert vet.returncode == 0, vet.stderr
    unformatted = subprocess.run(["gofmt", "-l", "."], cwd=module, capture_output=True, text=True, check=True)
    assert unformatted.stdout == "", f"not gofmt-formatted: {unformatted.stdout}"


def test_the_go_types_are_what_the_schema_generates(tmp_path: Path) -> None:
    """sdk/go/types_gen.go equals what scripts/generate_go_types.py writes from the proto now."""
    fresh = tmp_path / "types_gen.go"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_go_types.py"), "--out", str(fresh)],
        check=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    committed = (SDK / "types_gen.go").read_text()
    assert fresh.read_text() == committed, "stale: run python scripts/generate_go_types.py"


def test_every_exported_go_name_has_a_doc_comment() -> None:
    """godoc on every exported name of the SDK (types, functions, methods, constants' groups)."""
    missing = []
    for path in sorted(SDK.glob("*.go")):
        if path.name.endswith("_test.go"):
            continue
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            words = line.split()
            if len(words) < 2 or words[0] not in ("func", "type", "var", "const"):
                continue
            name = words[2] if words[0] == "func" and words[1].startswith("(") else words[1]
            if name[:1].isupper() and not (number and lines[number - 1].startswith("//")):
                missing.append(f"{path.name}:{number + 1}: {line.strip()}")
    assert not missing, "exported names without a doc comment:\n" + "\n".join(missing)


def test_the_go_driver_docs_sdk_md_shows_is_the_file_ci_builds() -> None:
    """docs/sdk.md's Go block is sdk/go/internal/fans/main.go exactly (vetted with the SDK)."""
    guide = (ROOT / "docs" / "sdk.md").read_text()
    code = (SDK / "internal" / "fans" / "main.go").read_text()
    assert f"```go\n{code}```" in guide

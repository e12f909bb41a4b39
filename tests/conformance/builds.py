"""The Go programs the conformance suite and the bench run: the Go SDK's conformance fixture,
docs/sdk.md's fans driver and the Go FPGA example, built with the machine's Go (no dependencies
beyond the SDK itself, so no module downloads; Go's build cache makes a second build take about a
second). ``built`` keeps each in the judges' per-user cache, named by a hash of its sources and
the Go that built it, so tests/support/prebuild.py can build them ahead of the tests."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from shim.compat.upstream.releases import cache_dir

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk" / "go"
EXAMPLE = ROOT / "examples" / "go-fpga"
# name -> (module folder, package within it)
PROGRAMS = {
    "go-fixture": (SDK, "./internal/fixture"),
    "go-fans": (SDK, "./internal/fans"),
    "go-fpga": (EXAMPLE, "."),
}
# As the project's other Go code (tests/support/legacy_plugins/go/build.sh): the module alone,
# go.mod the pin, no paths or VCS stamps of this checkout in the binary.
GO_ENV = {"GOWORK": "off", "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly"}


def build(name: str, out_dir: Path, timeout_s: float = 300) -> Path:
    """Build program ``name`` into ``out_dir``; CalledProcessError carries Go's own words."""
    module, package = PROGRAMS[name]
    binary = out_dir / name
    subprocess.run(
        ["go", "build", "-trimpath", "-buildvcs=false", "-o", str(binary), package],
        cwd=module, env={**os.environ, **GO_ENV}, check=True, timeout=timeout_s, capture_output=True,
    )  # fmt: skip
    return binary


def source_hash(name: str) -> str:
    """A hash of everything program ``name`` is built from: the SDK's Go sources, its own module's
    (the example's), and the version of the Go on PATH."""
    module, _ = PROGRAMS[name]
    digest = hashlib.sha256()
    for folder in sorted({SDK, module}):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    go = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True, timeout=60)
    digest.update(go.stdout.strip().encode())
    return digest.hexdigest()[:16]


def built(name: str, timeout_s: float = 300) -> Path:
    """Program ``name``, built now unless the cache holds this version of it. The cache sits in
    root's home, which the user a driver runs as may not enter: copy it out (``build`` is the same
    into a folder of one's own choosing)."""
    folder = cache_dir() / "sdk-go"
    target = folder / f"{name}-{source_hash(name)}"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building it: wait for it
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(prefix=".build-", dir=folder) as partial:
            build(name, Path(partial), timeout_s).replace(target)  # whole, or not there
        for stale in folder.glob(f"{name}-*"):  # earlier versions, a few MB each
            if stale != target:
                stale.unlink(missing_ok=True)
    return target

"""The committed generated code (src/shim/generated, src/shim/sdk/generated) must be exactly
what proto/ generates today.

A proto edited without regenerating (or a stub edited by hand) would make the code we ship
disagree with the .proto files every other test and reviewer reads.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
# Where each proto's protobuf stubs are committed, and which: the kubelet's APIs with gRPC's, the
# driver protocol's (proto/driver/) as the SDK's own, without (the protocol is JSON-RPC).
COMMITTED = ROOT / "src" / "shim" / "generated"
STUBS = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
DRIVER_PROTOS = Path("driver")
DRIVER_COMMITTED = ROOT / "src" / "shim" / "sdk" / "generated" / "protobuf"
DRIVER_STUBS = ("_pb2.py", "_pb2.pyi")
TREES = ("shim/generated", "shim/sdk/generated")
GENERATOR = ROOT / "scripts" / "generate_protos.py"
REGENERATE = "python scripts/generate_protos.py"


def _files(root: Path) -> dict[str, bytes]:
    """Every file below root by relative posix path, skipping bytecode caches."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def test_committed_generated_code_is_byte_for_byte_what_the_generator_writes(tmp_path: Path) -> None:
    """Guards against stale or hand-edited stubs: regenerates into a temp dir and compares every file."""
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{REGENERATE} failed:\n{result.stdout}\n{result.stderr}"

    problems = []
    for tree in TREES:
        fresh = _files(tmp_path / tree)
        committed = _files(ROOT / "src" / tree)
        assert fresh, f"the generator wrote nothing under {tree}"
        stale = sorted(name for name in fresh.keys() & committed.keys() if fresh[name] != committed[name])
        problems += [f"stale: src/{tree}/{name}" for name in stale]
        problems += [
            f"missing (not committed): src/{tree}/{name}" for name in sorted(fresh.keys() - committed.keys())
        ]
        problems += [
            f"extra (no longer generated): src/{tree}/{name}"
            for name in sorted(committed.keys() - fresh.keys())
        ]
    assert not problems, "\n".join(
        ["generated code is out of date with proto/:", *problems, f"regenerate with: {REGENERATE}"]
    )


def test_every_proto_file_has_a_committed_generated_module() -> None:
    """Guards against a .proto added under proto/ whose stubs were never generated and committed."""
    protos = sorted(PROTO_DIR.rglob("*.proto"))
    assert protos, f"no .proto files found under {PROTO_DIR}"
    missing = []
    for proto in protos:
        stem = proto.relative_to(PROTO_DIR).with_suffix("")
        driver = stem.is_relative_to(DRIVER_PROTOS)
        committed, suffixes = (DRIVER_COMMITTED, DRIVER_STUBS) if driver else (COMMITTED, STUBS)
        for suffix in suffixes:
            module = committed / stem.parent / f"{stem.name}{suffix}"
            if not module.is_file():
                source, target = proto.relative_to(ROOT).as_posix(), module.relative_to(ROOT).as_posix()
                missing.append(f"{source}: no {target}")
    assert not missing, "\n".join([*missing, f"generate with: {REGENERATE}"])

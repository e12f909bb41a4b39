"""python -m tests.conformance DRIVER-COMMAND...: a driver through the generic vectors, by hand."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from tests.conformance.runner import Mismatch, run_vector, vector_files


def main() -> None:
    command = sys.argv[1:]
    if not command:
        sys.exit("usage: python -m tests.conformance DRIVER-COMMAND...")
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        for vector in (v for v in vector_files() if v != "fixture"):
            stderr = Path(folder) / f"{vector}.stderr"
            try:
                asyncio.run(run_vector(command, vector, {"PATH": os.environ.get("PATH", "")}, stderr))
            except Mismatch as exc:
                failed += 1
                print(f"FAIL {vector}: {exc}\n--- stderr:\n{stderr.read_text(errors='replace')[-2000:]}")
            else:
                print(f"ok   {vector}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

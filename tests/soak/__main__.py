"""python -m tests.soak [--faults N] [--seed S] [--json FILE]: a soak run, its report printed.

Exit status 0 when no invariant was violated, 1 when one was, 2 when the soak could not run.
"""

from __future__ import annotations

import os

# Before grpc loads: its C core otherwise logs every GOAWAY (each devshim restart) at INFO.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import argparse
import asyncio
import json
import sys
from pathlib import Path

from .faults import FAULTS
from .report import render
from .runner import SoakError, SoakOptions, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.splitlines()[0])
    defaults = SoakOptions()
    parser.add_argument("--faults", type=int, default=defaults.faults, help="faults to inject")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the random choices")
    parser.add_argument("--json", type=Path, help="also write the report here")
    kinds = f"{', '.join(FAULTS)} (the default: all of these)"
    parser.add_argument("--kinds", default=",".join(FAULTS), help=f"comma-separated, of: {kinds}")
    parser.add_argument("--overlap", type=float, default=defaults.overlap,
                        help="chance that a fault follows the last before it has recovered")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the work dir (devshim's log) afterwards")
    args = parser.parse_args(argv)
    if args.faults < 1:
        parser.error("--faults must be at least 1")
    options = SoakOptions(
        faults=args.faults,
        seed=args.seed,
        kinds=tuple(k for k in args.kinds.split(",") if k),
        overlap=args.overlap,
        keep=args.keep,
    )
    try:
        report = asyncio.run(run_soak(options, progress=lambda line: print(line, file=sys.stderr)))
    except (SoakError, ValueError) as err:
        print(f"soak: {err}", file=sys.stderr)
        return 2
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if not report["passed"]:
        where = f"in {report['workdir']}" if args.keep else "its end is in the JSON report (--keep: all)"
        print(f"devshim's log: {where}", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

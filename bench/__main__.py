"""python -m bench: every benchmark row beside its baseline, as one table with each goal met or missed.

Usage: python -m bench [--quick] [--rows allocate,health,...] [--json FILE] [--claims N] [--nodes N,...]
Rows (docs/benchmarks.md): allocate, declared, preferred, goclient (a Go client, built on
first use), health, listsize, reregister, failover, memory, footprint, nodecost, podstart and
podstart_dra (the real node, root), startup, concurrency, opsflood, listflood, bound, dra,
dra_prepare, dra_flood (a real kube-apiserver, built on first use), sdk_rss and sdk_allocate (a
Go SDK driver beside the Python SDK's, built on first use), fleet (--nodes: publishers against
one kube-apiserver). Default settings take about 6 minutes on 2 cores, plus 8 for nodecost, 1 for
podstart, 5 for podstart_dra and 3 for fleet; --quick about two.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from bench import (
    allocate,
    bound,
    concurrency,
    dra,
    dra_flood,
    dra_prepare,
    failover,
    fleet,
    flood,
    footprint,
    goview,
    health,
    listsize,
    memory,
    nodecost,
    opsflood,
    podstart,
    reregister,
    sdk_drivers,
)
from bench.common import Result, compile_bytecode, table

Row = Callable[[bool], Awaitable[Result]]
ROWS: dict[str, Row] = {
    "allocate": allocate.allocate_per_call,
    "declared": allocate.allocate_declared,
    "preferred": allocate.preferred_allocation,
    "goclient": goview.goclient,
    "health": health.health_change,
    "listsize": listsize.list_size,
    "reregister": reregister.reregister,
    "failover": failover.failover,
    "memory": memory.memory,
    "footprint": footprint.footprint,
    "nodecost": nodecost.nodecost,
    "podstart": podstart.podstart,
    "podstart_dra": podstart.podstart_dra,
    "startup": footprint.startup,
    "concurrency": concurrency.concurrency,
    "opsflood": opsflood.ops_flood,
    "listflood": flood.flood,
    "bound": bound.bound,
    "dra": dra.dra_publish,
    "dra_prepare": dra_prepare.dra_prepare,
    "dra_flood": dra_flood.dra_flood,
    "sdk_rss": sdk_drivers.sdk_rss,
    "sdk_allocate": sdk_drivers.sdk_allocate,
    "fleet": fleet.fleet,
}


async def run(names: list[str], quick: bool) -> list[Result]:
    results = []
    for name in names:
        started = time.monotonic()
        print(f"{name} ...", end=" ", flush=True, file=sys.stderr)
        try:
            result = await ROWS[name](quick)
        except Exception as exc:  # one broken row must not cost the others
            traceback.print_exc()
            result = Result(name, {}, {}, "", "", None, note=f"failed: {exc!r}")
        result.extra["row"], result.extra["seconds"] = name, round(time.monotonic() - started, 1)
        print(f"{result.extra['seconds']} s", file=sys.stderr)
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples: a ~1 minute smoke run")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows (default: all)")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument(
        "--claims", type=int, help="claims the dra_prepare row prepares (default 200; --quick 50)"
    )
    parser.add_argument(
        "--nodes",
        help="comma-separated fleet sizes the fleet row simulates (default 10,100; e.g. 10,100,1000)",
    )
    args = parser.parse_args()
    if args.nodes is not None:
        try:
            sizes = tuple(int(n) for n in args.nodes.split(","))
        except ValueError:
            parser.error(f"--nodes: comma-separated numbers, not {args.nodes!r}")
        if not sizes or min(sizes) < 1:
            parser.error("--nodes: each size at least 1")
        ROWS["fleet"] = functools.partial(fleet.fleet, sizes=sizes)
    if args.claims is not None:
        if args.claims < 1:
            parser.error("--claims: at least 1")
        ROWS["dra_prepare"] = functools.partial(dra_prepare.dra_prepare, claims=args.claims)
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"unknown row(s) {', '.join(unknown)}; rows: {', '.join(ROWS)}")
    started = time.monotonic()
    compile_bytecode()
    results = asyncio.run(run(names, args.quick))
    total = time.monotonic() - started
    print(table(results))
    machine = f"{os.cpu_count()} CPUs, Python {platform.python_version()}, grpcio {grpc.__version__}"
    print(f"\n{len(results)} rows in {total:.0f} s{' (--quick)' if args.quick else ''}; {machine}")
    if args.json is not None:
        document = {
            "quick": args.quick,
            "total_s": round(total, 1),
            "machine": machine,
            "date": time.strftime("%Y-%m-%d"),
            "rows": [r.as_json() for r in results],
        }
        args.json.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()

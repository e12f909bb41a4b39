"""The matrix across machines: `--shard I/N` runs one of N balanced slices of the cells, and
`devshim compat merge` joins the shards' JSON reports into the report one run would give.

A vendor judging a driver at every release outgrows one machine, and CI engines (a GitHub
Actions matrix, a Kubernetes Indexed Job) already spread numbered jobs; devshim only has to cut
the cells the same way in every job. Each cell goes to a shard by longest-processing-time-first:
the cells sorted by cost, greatest first (ties by their ids), each given to the shard with the
least cost so far (ties: the lowest index), which is within 4/3 of the best balance. A cell's
cost is its seconds in an earlier report (``--costs``: any run's --json), else the median of the
known ones, else 1. The same cells, costs and N give every job the same cut, so each cell runs
in exactly one shard. Each shard's JSON carries what merge checks: the index, N, how many cells
the whole run has and a digest of them (so shards of different runs never merge).
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .results import Result, Status

Cell = tuple[str, str]  # (row, column), as a Result names it
MAX_REPORT_BYTES = 64 * 1024 * 1024  # a report of every cell at every release is under 1 MB
_SHARD = re.compile(r"([1-9][0-9]*)/([1-9][0-9]*)")


class ShardError(ValueError):
    """A shard spec, a costs file or a set of shard reports that cannot be used; says which."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        found = _SHARD.fullmatch(text.strip())
        if found is None or not 1 <= int(found[1]) <= int(found[2]):
            raise ShardError(f"--shard {text!r}: give I/N with 1 <= I <= N, e.g. 2/4")
        return cls(int(found[1]), int(found[2]))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def assign(cells: Sequence[Cell], count: int, costs: dict[Cell, float] | None = None) -> dict[Cell, int]:
    """Each cell's shard (1-based) of ``count``; the order ``cells`` come in does not matter."""
    known = costs or {}
    default = statistics.median(known.values()) if known else 1.0
    load = [0.0] * count
    shards: dict[Cell, int] = {}
    for cell in sorted(set(cells), key=lambda c: (-known.get(c, default), c)):
        lightest = min(range(count), key=lambda i: (load[i], i))
        load[lightest] += known.get(cell, default)
        shards[cell] = lightest + 1
    return shards


def digest(cells: Iterable[Cell]) -> str:
    """What names the whole run's cells: merge refuses shards whose digests differ."""
    text = "\n".join(f"{row}\t{column}" for row, column in sorted(set(cells)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_report(path: Path) -> dict[str, Any]:
    """A --json report, bounded and checked for the fields merge and --costs read."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_REPORT_BYTES + 1)
    except OSError as err:
        raise ShardError(f"cannot read {path}: {err.strerror}") from None
    if len(raw) > MAX_REPORT_BYTES:
        raise ShardError(f"{path} is over {MAX_REPORT_BYTES // 2**20} MiB: not a compat report")
    try:
        report = json.loads(raw)
        cells = report["cells"]
        for cell in cells:
            if not (isinstance(cell["scenario"], str) and isinstance(cell["mode"], str)):
                raise TypeError("a cell's scenario and mode are strings")
            Status(cell["status"])
            float(cell["seconds"])
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        raise ShardError(
            f"{path} is not a `devshim compat --json` report ({type(err).__name__}: {err})"
        ) from None
    return dict(report)


def costs_from(path: Path) -> dict[Cell, float]:
    """Each cell's measured seconds in an earlier report."""
    return {(c["scenario"], c["mode"]): float(c["seconds"]) for c in read_report(path)["cells"]}


def results_of(report: dict[str, Any]) -> list[Result]:
    return [
        Result(c["scenario"], c["mode"], Status(c["status"]), str(c.get("reason", "")), float(c["seconds"]))
        for c in report["cells"]
    ]


def merged(paths: Sequence[Path]) -> tuple[list[Result], dict[str, Any]]:
    """The shards' results as one run's, and the report's shared fields (what was tested, the
    rows and columns in order); ShardError unless the reports are every shard of one run, once."""
    if not paths:
        raise ShardError("give the shards' --json reports")
    reports = [(path, read_report(path)) for path in paths]
    specs = []
    for path, report in reports:
        spec = report.get("shard")
        if not isinstance(spec, dict):
            raise ShardError(f"{path} is not a shard's report (it was run without --shard)")
        specs.append((path, spec))
    first = specs[0][1]
    for path, spec in specs[1:]:
        for key in ("count", "cells", "digest"):
            if spec.get(key) != first.get(key):
                raise ShardError(f"{path} is a shard of another run than {specs[0][0]} ({key} differs)")
    seen: dict[object, Path] = {}
    for path, spec in specs:
        index = spec.get("index")
        if index in seen:
            raise ShardError(f"{path} and {seen[index]} are both shard {index}/{first['count']}")
        seen[index] = path
    count = int(first["count"])
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in seen]
    if missing:
        raise ShardError(f"shard(s) {', '.join(missing)} missing")
    results = [result for _, report in reports for result in results_of(report)]
    cells = [(r.row, r.column) for r in results]
    if len(set(cells)) != len(cells) or len(cells) != first["cells"] or digest(cells) != first["digest"]:
        raise ShardError(f"the shards hold {len(cells)} cells, not the run's {first['cells']} once each")
    shared = {key: reports[0][1].get(key) for key in ("tested", "rows", "columns", "row_label")}
    return results, shared

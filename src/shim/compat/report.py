"""The matrix's results for people (a table) and for CI (JUnit XML, JSON).

The table has a row per scenario and a column per mode; a column id's "/"-separated parts
(profile, API versions, registration path) are stacked as header lines, each written once over
the columns that share it. A failed or skipped cell, or a passed one with something to show
(the grant the allocate row got), carries a note number; the notes below the table give each
distinct reason once. A cell that was
not selected for this run is a dot.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from .results import Result, Status

NOT_RUN = "·"


def summary(results: Sequence[Result]) -> str:
    counts = {status: sum(r.status is status for r in results) for status in Status}
    return (
        f"{len(results)} cells run: {counts[Status.PASS]} passed, {counts[Status.FAIL]} failed, "
        f"{counts[Status.SKIP]} skipped"
    )


_MARKS = {Status.PASS: "ok", Status.FAIL: "FAIL", Status.SKIP: "skip"}


def table(
    results: Sequence[Result], rows: Sequence[str], columns: Sequence[str], row_label: str = "scenario"
) -> str:
    """The results as text: one line per row, one column per mode, notes for the reasons."""
    by_cell = {(r.row, r.column): r for r in results}
    notes: dict[tuple[Status, str], int] = {}
    cells: dict[tuple[str, str], str] = {}
    for key, result in by_cell.items():
        if result.status is Status.PASS and not result.reason:
            cells[key] = "ok"
            continue
        number = notes.setdefault((result.status, result.reason), len(notes) + 1)
        cells[key] = f"{_MARKS[result.status]} {number}"
    used = [c for c in columns if any((row, c) in by_cell for row in rows)]
    depth = max((len(c.split("/")) for c in used), default=1)
    headers = [c.split("/") + [""] * (depth - len(c.split("/"))) for c in used]
    widths = [max(7, *(len(part) for part in parts)) for parts in headers]
    first = max([len(row_label), *(len(row) for row in rows)])
    lines = []
    for level in range(depth):
        label = row_label if level == depth - 1 else ""
        parts = []
        for i, (h, w) in enumerate(zip(headers, widths, strict=True)):
            # A part the column shares with its left neighbour (and all parts above) is left blank.
            same = i > 0 and level < depth - 1 and headers[i - 1][: level + 1] == h[: level + 1]
            parts.append(("" if same else h[level]).ljust(w))
        lines.append("  ".join([label.ljust(first), *parts]).rstrip())
    for row in rows:
        if not any((row, c) in by_cell for c in used):
            continue
        parts = [cells.get((row, c), NOT_RUN).ljust(w) for c, w in zip(used, widths, strict=True)]
        lines.append("  ".join([row.ljust(first), *parts]).rstrip())
    if notes:
        lines.append("")
        for (status, reason), number in notes.items():
            lines.append(f"{number:>3}. {status.value if status is not Status.PASS else 'saw'}: {reason}")
    lines.append("")
    lines.append(summary(results))
    return "\n".join(lines)


def write_json(results: Sequence[Result], path: Path, meta: dict[str, object]) -> None:
    document = {
        **meta,
        "summary": {status.value: sum(r.status is status for r in results) for status in Status},
        "cells": [
            {"scenario": r.row, "mode": r.column, "status": r.status.value, "reason": r.reason,
             "seconds": r.seconds}
            for r in results
        ],
    }  # fmt: skip
    path.write_text(json.dumps(document, indent=2) + "\n")


def write_junit(results: Sequence[Result], path: Path, suite: str) -> None:
    """One testcase per cell, named scenario[mode]; classname groups them by scenario."""
    root = ET.Element(
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(sum(r.status is Status.FAIL for r in results)),
        skipped=str(sum(r.status is Status.SKIP for r in results)),
        time=f"{sum(r.seconds for r in results):.3f}",
    )
    for r in results:
        case = ET.SubElement(
            root,
            "testcase",
            classname=f"{suite}.{r.row}",
            name=f"{r.row}[{r.column}]",
            time=f"{r.seconds:.3f}",
        )
        if r.status is Status.FAIL:
            ET.SubElement(case, "failure", message=r.reason).text = r.reason
        elif r.status is Status.SKIP:
            ET.SubElement(case, "skipped", message=r.reason)
        elif r.reason:  # what a passing cell saw
            ET.SubElement(case, "system-out").text = r.reason
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)

"""What a cell of the matrix came to: passed, failed with a reason, or skipped with a reason.

A check is an async function of one cell's world. It passes by returning (a string it returns
is shown with the pass: what it saw, such as the grant Allocate gave), fails by raising
(`Failed` with a message meant for the person reading the report; any other exception is
reported with its type), and skips by raising `Skip` when the cell cannot apply to what is being
tested (a driver without pre-start has nothing to check in the pre-start row).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


class Skip(Exception):
    """The cell does not apply; the message says why."""


class Failed(Exception):
    """The check found a problem; the message says what the kubelet would see."""


def expect(condition: bool, message: str) -> None:
    """Fail with `message` unless `condition` holds (a check's assert, kept under -O)."""
    if not condition:
        raise Failed(message)


@dataclass(frozen=True)
class Result:
    """One cell: `row` is the scenario or check, `column` the mode or profile it ran in."""

    row: str
    column: str
    status: Status
    reason: str = ""
    seconds: float = 0.0


async def run_cell(
    row: str, column: str, check: Callable[[], Awaitable[str | None]], timeout_s: float
) -> Result:
    """Run one check under a deadline; every outcome becomes a Result, nothing escapes but a cancel."""
    started = time.monotonic()

    def result(status: Status, reason: str = "") -> Result:
        return Result(row, column, status, reason, round(time.monotonic() - started, 3))

    try:
        async with asyncio.timeout(timeout_s):
            seen = await check()
    except Skip as skip:
        return result(Status.SKIP, str(skip))
    except Failed as failure:
        return result(Status.FAIL, str(failure))
    except TimeoutError as err:
        # Our own deadline, or one inside the check (a wait that never saw its state).
        detail = str(err) or f"the cell did not finish within {timeout_s:g} s"
        return result(Status.FAIL, f"timed out: {detail}")
    except Exception as err:
        return result(Status.FAIL, f"{type(err).__name__}: {err}")
    return result(Status.PASS, seen or "")


Check = Callable[[], Awaitable[str | None]]


async def run_cells(
    cells: Iterable[tuple[str, str, Check]], timeout_s: float, progress: Callable[[Result], None]
) -> list[Result]:
    """Run (row, column, check) cells one after another; a result per cell, in order."""
    results = []
    for row, column, check in cells:
        result = await run_cell(row, column, check, timeout_s)
        progress(result)
        results.append(result)
    return results

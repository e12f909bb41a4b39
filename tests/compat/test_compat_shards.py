"""`devshim compat --shard I/N` and `devshim compat merge` as real processes: a run's shards,
run one by one as the jobs of a CI matrix would, run every cell of the one run exactly once, and
their reports merge into that run's verdict, cell by cell, with its exit code; reports that are
not every shard of one run, once, are refused (exit 2, naming the problem)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import DRIVERS
from tests.support.compat_run import Run, compat
from tests.support.devshim_process import DEVSHIM

BROKEN = DRIVERS / "broken.py"
ROWS = ("register", "allocate", "prestart", "deallocate")
SHARDS = 3


def selection(state: Path) -> list[str]:
    """A driver whose pre-start fails, at two modes: a run with passes, failures and skips."""
    driver = f"{shlex.quote(sys.executable)} {BROKEN} prestart-fails --state-dir {state}"
    return [
        "--driver", driver, "--driver-user", "root", "--profile=next", "--profile=1.33+",
        "--kubelet=both", "--kubelet=v1beta1", "--registration=classic",
        *(f"--scenario={row}" for row in ROWS),
    ]  # fmt: skip


def merge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEVSHIM, "compat", "merge", *args], capture_output=True, text=True, timeout=60)


def outcomes(cells: list[dict[str, object]]) -> dict[tuple[object, object], tuple[object, object]]:
    return {(c["scenario"], c["mode"]): (c["status"], c["reason"]) for c in cells}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, list[Run], list[Path]]:
    """The one run, then its shards balanced by its costs, each in its own folder; the last of
    the reports is the one run's."""
    whole = tmp_path_factory.mktemp("whole")
    one = compat(whole, *selection(whole))
    shards, reports = [], []
    for index in range(1, SHARDS + 1):
        folder = tmp_path_factory.mktemp(f"shard{index}")
        costs = ("--costs", str(whole / "compat.json"))
        shards.append(compat(folder, *selection(folder), "--shard", f"{index}/{SHARDS}", *costs))
        reports.append(folder / "compat.json")
    return one, shards, [*reports, whole / "compat.json"]


def test_the_shards_run_every_cell_once_and_merge_to_the_runs_verdict(
    runs: tuple[Run, list[Run], list[Path]], tmp_path: Path
) -> None:
    one, shards, reports = runs[0], runs[1], runs[2][:SHARDS]
    assert one.code == 1 and one.by_status("fail") and one.by_status("pass")
    cells = [(c["scenario"], c["mode"]) for shard in shards for c in shard.cells]
    assert sorted(cells) == sorted((c["scenario"], c["mode"]) for c in one.cells)  # each once
    assert all(shard.cells for shard in shards), "a shard ran nothing: the cut is not balanced"
    assert [shard.code for shard in shards].count(1) >= 1
    merged_json, merged_xml = tmp_path / "merged.json", tmp_path / "merged.xml"
    result = merge(*map(str, reversed(reports)), "--json", str(merged_json), "--junit", str(merged_xml))
    assert result.returncode == one.code, result.stderr
    document = json.loads(merged_json.read_text())
    assert outcomes(document["cells"]) == outcomes(one.cells)
    assert [(c["scenario"], c["mode"]) for c in document["cells"]] == [
        (c["scenario"], c["mode"]) for c in one.cells
    ]
    assert document["summary"] == one.summary
    summary = f"{len(one.cells)} cells run: {one.summary['pass']} passed, {one.summary['fail']} failed"
    assert summary in one.stdout and summary in result.stdout
    assert merged_xml.read_text().count("<testcase") == len(one.cells)


def test_each_shard_says_what_of_the_run_it_is(runs: tuple[Run, list[Run], list[Path]]) -> None:
    one, reports = runs[0], runs[2][:SHARDS]
    specs = [json.loads(path.read_text())["shard"] for path in reports]
    assert [s["index"] for s in specs] == list(range(1, SHARDS + 1))
    assert {(s["count"], s["cells"]) for s in specs} == {(SHARDS, len(one.cells))}
    assert len({s["digest"] for s in specs}) == 1


def test_reports_that_are_not_every_shard_of_one_run_once_are_refused(
    runs: tuple[Run, list[Run], list[Path]], tmp_path: Path
) -> None:
    one, reports, whole = runs[0], runs[2][:SHARDS], runs[2][SHARDS]
    other = tmp_path / "other.json"
    document = json.loads(reports[2].read_text())
    document["shard"]["digest"] = "0" * 16
    other.write_text(json.dumps(document))
    for args, message in (
        (reports[:2], f"shard(s) 3/{SHARDS} missing"),
        ([reports[0], reports[0], *reports[1:]], f"are both shard 1/{SHARDS}"),
        ([*reports[:2], other], "is a shard of another run than"),
        ([whole], "was run without --shard"),
        ([tmp_path / "absent.json"], "cannot read"),
    ):
        result = merge(*map(str, args))
        assert result.returncode == 2, (message, result.stdout)
        assert message in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert one.code == 1  # the run itself is not touched by what merge refuses


@pytest.mark.parametrize("spec", ["0/3", "4/3", "3", "a/b", "1/0"])
def test_a_shard_that_names_no_slice_exits_2(spec: str) -> None:
    result = subprocess.run(
        [*DEVSHIM, "compat", "--driver", "true", "--shard", spec], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "give I/N with 1 <= I <= N" in result.stderr, result.stderr

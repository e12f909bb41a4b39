"""`devshim compat --plugin`: the plugin matrix run against real plugin processes.

The Go legacy plugin (tests/support/legacy_plugins/go) must pass every cell; the Python legacy plugin
(tests/support/legacy_plugins/python), given one deliberate bug at a time, must fail exactly the rows that
bug breaks, for the reason the kubelet would see.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from shim.compat.fakekubelet import FakeKubelet
from shim.compat.modes import PROFILES
from shim.compat.plugin_checks import PLUGIN_CHECKS, plugin_cells, run_plugin_matrix
from shim.compat.plugin_process import KUBELET_DIR
from shim.compat.plugin_world import NO_HOOK, NOT_STARTED, PluginUnderTest
from shim.compat.report import table
from shim.compat.results import Result, Status
from tests.support.legacy import FLIP, PYTHON_PLUGIN, python_plugin
from tests.support.unix import short_temp_dir

PY_PLUGIN = PYTHON_PLUGIN / "plugin.py"
ROWS = list(PLUGIN_CHECKS)
# The Python plugin never registers again after a kubelet restart: one variant proves the row
# catches that (waiting out its 15 s deadline); the others leave the row out, and the rows that
# only the variant of their own bug runs (for time).
OWN_VARIANT = ("reregister", "crash_restart", "change_after_dropped_stream")
NO_REREGISTER = [row for row in ROWS if row not in OWN_VARIANT]


def mismatches(
    results: Sequence[Result], fails: dict[str, str], skips: dict[str, str] | None = None
) -> list[str]:
    """How `results` differ from: the rows in `fails` fail and those in `skips` skip, each with a
    reason containing the given text, and every other row passes."""
    wrong = []
    for r in results:
        status, text = Status.PASS, ""
        if r.row in fails:
            status, text = Status.FAIL, fails[r.row]
        elif skips and r.row in skips:
            status, text = Status.SKIP, skips[r.row]
        if r.status is not status or text not in r.reason:
            wrong.append(
                f"{r.row}[{r.column}]: {r.status.value} {r.reason!r}; expected {status.value} {text!r}"
            )
    return wrong


def shown(results: Sequence[Result]) -> str:
    return str(table(results, ROWS, PROFILES))


async def test_the_go_plugin_passes_every_check_in_every_profile(goplug: Path) -> None:
    """A plugin that serves before it registers, keeps its stream open, lists full lists and
    registers again after every kubelet restart and every crash passes all 36 cells. The profiles run side by
    side (each cell in its own directory) to keep the test short."""
    plugin = PluginUnderTest(f"{shlex.quote(str(goplug))} -dir {{dir}}", None, change_hook=FLIP)
    runs = await asyncio.gather(*(run_plugin_matrix(plugin, plugin_cells(None, [p])) for p in PROFILES))
    results = [result for run in runs for result in run]
    assert len(results) == len(ROWS) * len(PROFILES)
    assert mismatches(results, {}) == [], shown(results)


@dataclass(frozen=True)
class Variant:
    """The Python plugin with one bug (env), the cells to run and the rows that must fail/skip."""

    env: dict[str, str]
    cells: list[tuple[str, str]]
    fails: dict[str, str]
    skips: dict[str, str] = field(default_factory=dict)


NOT_SERVED = "the plugin called Register before its socket served: when Register arrived, its socket"
NO_LIST = "ListAndWatch ended before its first message: RESOURCE_EXHAUSTED"
VARIANTS = {
    # 1.24 dials only after Register returned, so the kubelet itself never fails it: the check must.
    "register-first": Variant(
        {"PY_REGISTER_FIRST": "1"},
        plugin_cells(["serves_before_register"]) + plugin_cells(NO_REREGISTER[1:], ["1.24"]),
        {"serves_before_register": NOT_SERVED},
    ),
    "return-from-listandwatch": Variant(
        {"PY_BUG": "return-from-listandwatch"},
        plugin_cells(NO_REREGISTER, ["1.25-1.32"]),
        {"stream_open": "ListAndWatch ended within 2 s of the first list (with status OK)"},
    ),
    "lowercase-health": Variant(
        {"PY_BUG": "lowercase-health"},
        plugin_cells(NO_REREGISTER, ["1.33+"]),
        {"full_lists": "device p0 has health 'healthy'; the kubelet compares with exactly 'Healthy'"},
        {"allocate": "the plugin lists no device with health exactly 'Healthy'"},
    ),
    "empty-allocate": Variant(
        {"PY_BUG": "empty-allocate"},
        plugin_cells(NO_REREGISTER, ["next"]),
        {"allocate": "Allocate with 1 container requests got 0 container responses"},
    ),
    # Too big a first list reaches the kubelet as no list at all, which every list-reading row sees.
    "oversized-list": Variant(
        {"PY_BUG": "oversized-list"},
        plugin_cells(NO_REREGISTER, ["1.33+"]),
        {
            "message_limit": "a ListAndWatch message exceeded the kubelet's 4 MiB gRPC receive limit",
            "full_lists": NO_LIST,
            "stream_open": NO_LIST,
            "allocate": NO_LIST,
        },
    ),
    "socket-per-second": Variant(
        {"PY_BUG": "socket-per-second"},
        plugin_cells(["crash_restart"], ["1.33+"]),
        {
            "crash_restart": "killed and started again at once, the second start within the second of "
            "the first: the plugin did not register again within 15 s; the plugin's log ends: "
        },
    ),
    "leaked-list-loop": Variant(
        {"PY_BUG": "leaked-list-loop"},
        plugin_cells(["change_after_dropped_stream"], ["1.25-1.32"]),
        {
            "change_after_dropped_stream": "the health hook changed p2, but the ListAndWatch stream opened "
            "after the first was dropped got no new list within 5 s"
        },
    ),
    "no-reregistration": Variant(
        {},
        plugin_cells(["reregister"], ["1.25-1.32"]),
        {
            "reregister": "the plugin did not register again within 15 s of a kubelet restart "
            "(1.25-1.32 cleanup: every file but the checkpoint removed"
        },
    ),
}


async def test_each_deliberate_bug_fails_exactly_its_rows(stubs: Path) -> None:
    """Each bug of the Python plugin fails the rows that bug breaks, saying why, and no other row.
    The variants run side by side (each cell in its own directory) to keep the test short."""

    async def run(variant: Variant) -> list[Result]:
        results: list[Result] = await run_plugin_matrix(python_plugin(stubs, variant.env), variant.cells)
        return results

    # Side by side, but the one whose bug shows only in a plugin's first second alone, after:
    # the others' start-ups could make it take longer than that to come up.
    alone = ["socket-per-second"]
    side_by_side = await asyncio.gather(*(run(v) for n, v in VARIANTS.items() if n not in alone))
    after = [await run(VARIANTS[n]) for n in alone]
    runs = [*side_by_side, *after]
    order = [*(n for n in VARIANTS if n not in alone), *alone]
    wrong = {
        name: found
        for name, results in zip(order, runs, strict=True)
        if (found := mismatches(results, VARIANTS[name].fails, VARIANTS[name].skips))
    }
    tables = [f"{name}:\n{shown(results)}" for name, results in zip(order, runs, strict=True)]
    assert wrong == {}, "\n\n".join(tables)


@pytest.mark.skipif(os.geteuid() != 0, reason="a private mount namespace needs root")
async def test_a_plugin_hardcoding_the_kubelet_dir_runs_in_a_private_mount_namespace(
    stubs: Path,
) -> None:
    """Without {dir} the plugin uses /var/lib/kubelet/device-plugins; run in a mount namespace
    with the cell's directory bound there, it meets the fake kubelet, and nothing is left behind
    on the host."""
    existed = KUBELET_DIR.exists()
    plugin = python_plugin(stubs, {}, hardcoded=True)
    cells = plugin_cells(["serves_before_register", "options", "full_lists", "allocate"], ["1.24", "1.33+"])
    results = await run_plugin_matrix(plugin, cells)
    assert mismatches(results, {}) == [], shown(results)
    assert KUBELET_DIR.exists() == existed


@pytest.fixture
def running_dir() -> Iterator[Path]:
    with short_temp_dir("ds-run-") as path:
        yield path


async def test_socket_mode_checks_a_running_plugin_and_skips_the_registration_rows(
    stubs: Path,
    running_dir: Path,
) -> None:
    """--socket: a plugin started by someone else (here registered with its own fake kubelet)
    passes the rows that need only its socket; the rows that watch it register are skipped."""
    env = {**os.environ, "DP_DIR": str(running_dir), "PYTHONPATH": str(stubs)}
    async with FakeKubelet(running_dir) as kubelet:
        process = await asyncio.create_subprocess_exec(sys.executable, str(PY_PLUGIN), env=env)
        try:
            await kubelet.wait_for_plugin("example.com/pyplug", timeout=15)
            plugin = PluginUnderTest(None, running_dir / "pyplug.sock")
            results = await run_plugin_matrix(plugin, plugin_cells(profiles=["1.24", "next"]))
        finally:
            process.terminate()
            await process.wait()
    skips = dict.fromkeys(["serves_before_register", "reregister", "crash_restart"], NOT_STARTED)
    skips["change_after_dropped_stream"] = NO_HOOK
    assert mismatches(results, {}, skips) == [], shown(results)


def test_a_plugin_is_a_command_or_a_socket_and_dir_is_filled_in() -> None:
    """Exactly one of command and socket; {dir} is replaced inside arguments after splitting."""
    with pytest.raises(ValueError):
        PluginUnderTest(None, None)
    with pytest.raises(ValueError):
        PluginUnderTest("plug", Path("/tmp/x.sock"))
    plugin = PluginUnderTest("plug --dir={dir} 'a b'", None)
    assert plugin.argv(Path("/tmp/d")) == ["plug", "--dir=/tmp/d", "a b"]
    assert not plugin.hardcodes_dir and PluginUnderTest("plug", None).hardcodes_dir


def test_without_root_a_plugin_hardcoding_the_kubelet_dir_is_skipped_saying_why(tmp_path: Path) -> None:
    """Not root (here: a user namespace, where our uid reads as nobody): every cell skips with the
    reason and the way out, and nothing is started or mounted."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing")
    report = tmp_path / "compat.json"
    command = [
        sys.executable,
        "-m",
        "shim",
        "compat",
        "--plugin",
        "true",
        "--profile",
        "next",
        "--json",
        str(report),
    ]
    result = subprocess.run(["unshare", "--user", *command], capture_output=True, text=True, timeout=120)
    if "unshare failed" in result.stderr or "Operation not permitted" in result.stderr:
        pytest.skip(f"user namespaces are not available here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    cells = json.loads(report.read_text())["cells"]
    assert len(cells) == len(PLUGIN_CHECKS) and {c["status"] for c in cells} == {"skip"}
    assert all("needs root" in c["reason"] and "{dir}" in c["reason"] for c in cells)

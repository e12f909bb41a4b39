"""`devshim compat`: choose the cells, run them, print the table, write JUnit/JSON, exit code.

shim.cli parses the flags and calls `run`; everything about the matrix itself lives here.
"""

from __future__ import annotations

import asyncio
import functools
import shlex
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from loguru import logger

from .driver_matrix import driver_cells, run_driver_matrix
from .driver_scenarios import SCENARIOS, expectation
from .driver_world import DriverUnderTest
from .modes import MODES, PROFILES, REGISTRATIONS, VERSION_SETS, Mode, in_default_subset
from .plugin_checks import PLUGIN_CHECKS, plugin_cells, run_plugin_matrix
from .plugin_process import orphans_ended
from .plugin_world import PluginUnderTest
from .report import table, write_json, write_junit
from .results import Failed, Result, Status
from .shards import Cell, Shard, ShardError, assign, costs_from, digest, merged

if TYPE_CHECKING:
    from .dra_matrix import Pair
    from .upstream.releases import Release

_MARK = {Status.PASS: ".", Status.FAIL: "F", Status.SKIP: "s"}
Progress = Callable[[Result], None]  # told of each cell as it ends
T = TypeVar("T")


class UsageError(ValueError):
    """Flags that do not make a run; the message says which."""


@dataclass
class Selection:
    """Which cells to run: every filter empty means all of that axis."""

    profiles: Sequence[str] = ()
    kubelets: Sequence[str] = ()
    registrations: Sequence[str] = ()
    scenarios: Sequence[str] = ()
    quick: bool = False
    # The upstream judge's releases ("upstream", "upstream-1.37"); empty: the model's profiles.
    judges: Sequence[str] = ()
    # With --dra: KUBELET/APISERVER pairs ("1.33/1.33", "all"); empty: the oldest and newest.
    dra_pairs: Sequence[str] = ()

    def check(self) -> None:
        if self.judges and (self.profiles or self.kubelets or self.quick):
            raise UsageError(
                "--profile, --kubelet and --quick select the model's cells; with --judge, choose "
                "releases by --judge and paths by --registration"
            )
        for given, known, what in (
            (self.profiles, PROFILES, "profile"),
            (self.kubelets, tuple(VERSION_SETS), "kubelet"),
            (self.registrations, REGISTRATIONS, "registration"),
        ):
            unknown = sorted(set(given) - set(known))
            if unknown:
                raise UsageError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(known)}")

    def modes(self) -> list[Mode]:
        return [
            m
            for m in MODES
            if (not self.profiles or m.kubelet.profile in self.profiles)
            and (not self.kubelets or m.kubelet.speaks in self.kubelets)
            and (not self.registrations or m.registration in self.registrations)
        ]


@dataclass
class Request:
    """One `devshim compat` invocation, as parsed by the CLI."""

    driver: str | None = None
    plugin: str | None = None
    socket: Path | None = None
    health_hook: str | None = None
    selection: Selection = field(default_factory=Selection)
    junit: Path | None = None
    json: Path | None = None
    cell_timeout_s: float = 90.0
    prebuild: bool = False  # with --judge: build the harnesses, run nothing
    config: Path | None = None  # devshim's settings: the driver's entry is run as `run` would
    driver_name: str | None = None  # which of --config's drivers (needed when it has several)
    relaxed: bool = False  # any grant, the caller's environment and user
    driver_user: str | None = None  # who the driver runs as, over --config's drivers[].user
    suggest_policy: bool = False  # print the declaration the driver's grants needed, in any case
    expect: Sequence[str] = ()  # what every Allocate answer must contain
    health_watch_s: float = 0.0  # how long the health_watch row waits
    cdi_dirs: Sequence[Path] = ()  # CDI spec folders the granted names may resolve in
    dra: bool = False  # the DRA judge: --config's DRA pool under real DRA managers and API servers
    dra_plugin: str | None = None  # with --dra: a DRA kubelet plugin's command, judged without devshim
    shard: Shard | None = None  # run only this slice of the cells (shards.py)
    costs: Path | None = None  # an earlier --json report: each cell's seconds, to balance the shards
    shard_report: dict[str, object] | None = None  # what a shard's --json says of the whole run


def _sharded(request: Request, cells: Sequence[Cell]) -> set[Cell]:
    """The cells of ``cells`` this run runs: all, or its shard's (and what its report says)."""
    if request.shard is None:
        if request.costs is not None:
            raise UsageError("--costs balances shards: give --shard too")
        return set(cells)
    try:
        costs = costs_from(request.costs) if request.costs is not None else None
    except ShardError as err:
        raise UsageError(str(err)) from None
    shards = assign(cells, request.shard.count, costs)
    request.shard_report = {"index": request.shard.index, "count": request.shard.count,
                            "cells": len(shards), "digest": digest(cells)}  # fmt: skip
    kept = {cell for cell, index in shards.items() if index == request.shard.index}
    sys.stderr.write(f"devshim compat: shard {request.shard}: {len(kept)} of {len(shards)} cells\n")
    return kept


def run(request: Request) -> int:
    """Run the chosen matrix; 0 only if every cell that applied passed, 1 otherwise."""
    if request.dra and request.dra_plugin is not None:
        return _dra_plugin(request)
    if request.dra_plugin is not None:
        raise UsageError("--dra-plugin is judged by the DRA judge: give --dra too (--dra --dra-plugin CMD)")
    if request.dra:
        return _dra(request)
    if request.selection.dra_pairs:
        raise UsageError("--dra-pair chooses the DRA judge's columns: give --dra too")
    if (
        request.config is not None
        and request.driver is None
        and request.plugin is None
        and request.socket is None
    ):
        request.driver = shlex.join(_configured_driver(request.config, request.driver_name)["command"])
    given = [flag for flag, value in (("--driver", request.driver), ("--plugin", request.plugin),
                                      ("--socket", request.socket)) if value is not None]  # fmt: skip
    if len(given) != 1 and not (request.prebuild and not given):  # --prebuild alone tests nothing
        got = f" (got {', '.join(given)})" if given else ""
        raise UsageError(f"give exactly one of --driver, --plugin and --socket{got}")
    request.selection.check()
    if request.selection.judges:
        return _judged(request, given)
    if request.prebuild:
        raise UsageError("--prebuild builds the upstream judge: give --judge too")
    if request.driver is not None:
        argv = shlex.split(request.driver)
        if not argv:
            raise UsageError("--driver: the command is empty")
        results, rows, columns, what, driver = _driver(request, argv)
        code = _report(request, results, rows, columns, "scenario", what)
        _suggest(request, driver)
        return code
    if request.selection.kubelets or request.selection.registrations or request.cdi_dirs:
        raise UsageError("--kubelet, --registration and --cdi-dir apply to --driver only")
    results, rows, columns, what = _plugin(request)
    return _report(request, results, rows, columns, "check", what)


def _suggest(request: Request, driver: DriverUnderTest) -> None:
    """The declaration the driver's grants needed: printed when compat learnt it (no --config),
    when the declared policy refused a grant, or on --suggest-policy."""
    suggestion = driver.suggestion
    if not (request.suggest_policy or not driver.declared or suggestion.refused):
        return
    import yaml

    name = driver.entry.get("name", "my-driver")
    resources = driver.entry.get("resources") or sorted(suggestion.resources)
    entry = {"name": name, "command": list(driver.command), "resources": resources}
    if "user" in driver.entry:  # as it ran: a replay runs it as the same user
        entry["user"] = driver.entry["user"]
    if policy := suggestion.policy():
        entry["policy"] = policy
    refused = suggestion.refused
    why = f"{refused} grant{' was' if refused == 1 else 's were'} refused; " if refused else ""
    print(
        f"\n{why}the declaration this driver's grants needed (devshim's settings, docs/configuration.md, "
        f'"Grant policy"):\n'
    )
    print(yaml.safe_dump({"drivers": [entry]}, default_flow_style=None, sort_keys=False).rstrip())
    if suggestion.floor:
        print("\nIts grants also held what the floor refuses, which only `unsafe: {RULE: true}` lifts:")
        for rule, values in sorted(suggestion.floor.items()):
            print(f"  {rule}: {', '.join(sorted(values))}")


def _report(
    request: Request, results: list[Result], rows: list[str], columns: list[str], row_label: str, what: str
) -> int:
    print(table(results, rows, columns, row_label))
    failed = [r for r in results if r.status is Status.FAIL]
    if failed:
        print("\nTo repeat a failed cell:")
        for result in failed:
            print(f"  {repeat_command(request, result)}")
    # What merge needs to print one run's table from shards' reports (shards.py).
    meta: dict[str, object] = {"tested": what, "row_label": row_label, "rows": rows, "columns": columns}
    if request.shard_report is not None:
        meta["shard"] = request.shard_report
    if request.json is not None:
        write_json(results, request.json, meta)
    if request.junit is not None:
        write_junit(results, request.junit, "devshim-compat")
    return 1 if failed else 0


def merge(reports: Sequence[Path], junit: Path | None, json_file: Path | None) -> int:
    """`devshim compat merge`: the shards' --json reports as one run's table, JSON and JUnit,
    with one run's exit code (UsageError unless they are every shard of one run, once)."""
    try:
        results, shared = merged(reports)
    except ShardError as err:
        raise UsageError(str(err)) from None
    rows = [str(r) for r in shared.get("rows") or dict.fromkeys(r.row for r in results)]
    columns = [str(c) for c in shared.get("columns") or dict.fromkeys(r.column for r in results)]
    order = {cell: i for i, cell in enumerate((row, column) for row in rows for column in columns)}
    results.sort(key=lambda r: order.get((r.row, r.column), len(order)))
    row_label = str(shared.get("row_label") or "scenario")
    print(table(results, rows, columns, row_label))
    meta: dict[str, object] = {"tested": shared.get("tested"), "row_label": row_label, "rows": rows,
                               "columns": columns, "merged": len(reports)}  # fmt: skip
    if json_file is not None:
        write_json(results, json_file, meta)
    if junit is not None:
        write_junit(results, junit, "devshim-compat")
    return 1 if any(r.status is Status.FAIL for r in results) else 0


def repeat_command(request: Request, result: Result) -> str:
    """The `devshim compat` command that runs just this cell again."""
    if request.dra_plugin is not None:
        return shlex.join(["devshim", "compat", "--dra", "--dra-plugin", request.dra_plugin,
                           "--scenario", result.row, "--dra-pair", result.column])  # fmt: skip
    argv = ["devshim", "compat"]
    given: list[tuple[str, object]] = [
        ("--driver", request.driver), ("--plugin", request.plugin), ("--socket", request.socket),
        ("--health-hook", request.health_hook), ("--config", request.config),
        ("--driver-name", request.driver_name), ("--driver-user", request.driver_user),
    ]  # fmt: skip
    for flag, value in given:
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--relaxed"] if request.relaxed else []
    argv += ["--health-watch", f"{request.health_watch_s:g}"] if request.health_watch_s else []
    for expected in request.expect:
        argv += ["--expect", expected]
    for folder in request.cdi_dirs:
        argv += ["--cdi-dir", str(folder)]
    argv += ["--scenario", result.row]
    parts = result.column.split("/")
    if request.dra:
        argv += ["--dra", "--dra-pair", result.column]
    elif request.selection.judges:
        argv += ["--judge", parts[0]] + (["--registration", parts[1]] if len(parts) > 1 else [])
    elif request.driver is not None:
        argv += ["--profile", parts[0], "--kubelet", parts[1], "--registration", parts[2]]
    else:
        argv += ["--profile", parts[0]]
    return shlex.join(argv)


def _judged(request: Request, given: list[str]) -> int:
    """The matrix with the upstream judge: build what is missing, then run its cells."""
    from .upstream import releases as upstream  # its own imports only when asked for

    sel = request.selection
    try:
        chosen = upstream.choose(list(sel.judges))
    except ValueError as err:
        raise UsageError(str(err)) from None
    if request.socket is not None:
        raise UsageError("--judge runs the plugin itself: give --plugin or --driver, not --socket")
    try:
        upstream.check_can_run(chosen)
        sys.stderr.write(f"devshim compat: {upstream.requirements(chosen)}\n")
        binaries = {release: upstream.build(release) for release in chosen}
    except upstream.JudgeUnavailable as err:
        raise UsageError(str(err)) from None
    if request.prebuild:
        for release, binary in binaries.items():
            print(f"{release.name} ({release.version}): {binary}")
        return 0
    if request.driver is not None:
        return _judged_driver(request, binaries)
    return _judged_plugin(request, binaries)


def _judged_driver(request: Request, binaries: dict[Release, Path]) -> int:
    from .upstream.matrix import column, judged_cells, run_judged_matrix

    assert request.driver is not None
    argv = shlex.split(request.driver)
    if not argv:
        raise UsageError("--driver: the command is empty")
    sel = request.selection
    try:
        cells = judged_cells(sel.scenarios or None, sorted(binaries), sel.registrations or None)
    except ValueError as err:
        raise UsageError(str(err)) from None
    rows = list(dict.fromkeys(s for s, _, _ in cells))
    columns = list(dict.fromkeys(column(r, g) for _, r, g in cells))
    kept = _sharded(request, [(s, column(r, g)) for s, r, g in cells])
    cells = [(s, r, g) for s, r, g in cells if (s, column(r, g)) in kept]
    driver = driver_under_test(request, argv)
    sys.stderr.write(f"devshim compat: {len(cells)} cells for driver {shlex.join(argv)}\n")
    sys.stderr.write(f"devshim compat: the driver runs {driver.describe()}\n")
    results = _run_cells(
        run_judged_matrix(
            driver, cells, binaries, timeout_s=request.cell_timeout_s, progress=_progress(len(cells))
        )
    )
    code = _report(request, results, rows, columns, "scenario", f"driver: {shlex.join(argv)}")
    _suggest(request, driver)
    return code


def _judged_plugin(request: Request, binaries: dict[Release, Path]) -> int:
    from .upstream.plugin_checks import CHECKS, run_judged_plugin_matrix

    sel = request.selection
    if request.health_hook or sel.registrations:
        raise UsageError("--health-hook (with --judge) and --registration apply to --driver only")
    unknown = sorted(set(sel.scenarios) - set(CHECKS))
    if unknown:
        raise UsageError(f"unknown checks {unknown}; checks: {', '.join(CHECKS)}")
    cells = [(c, r) for c in (sel.scenarios or CHECKS) for r in sorted(binaries)]
    rows = list(dict.fromkeys(c for c, _ in cells))
    columns = list(dict.fromkeys(r.name for _, r in cells))
    kept = _sharded(request, [(c, r.name) for c, r in cells])
    cells = [(c, r) for c, r in cells if (c, r.name) in kept]
    plugin = PluginUnderTest(command=request.plugin)
    sys.stderr.write(f"devshim compat: {len(cells)} cells for plugin: {request.plugin}\n")
    results = _run_cells(
        run_judged_plugin_matrix(plugin, cells, binaries, timeout_s=request.cell_timeout_s,
                                 progress=_progress(len(cells)))
    )  # fmt: skip
    return _report(request, results, rows, columns, "check", f"plugin: {request.plugin}")


def _progress(total: int) -> Progress:
    """A mark per finished cell on stderr, so a long run shows it is moving."""
    done = 0

    def report(result: Result) -> None:
        nonlocal done
        done += 1
        sys.stderr.write(_MARK[result.status])
        if done == total or done % 60 == 0:
            sys.stderr.write(f" {done}/{total}\n")
        sys.stderr.flush()

    return report


def driver_under_test(request: Request, argv: list[str]) -> DriverUnderTest:
    """The driver as `devshim run` would run it: its entry in --config (or the defaults)."""
    for expected in request.expect:
        try:
            expectation(expected)
        except ValueError as err:
            raise UsageError(str(err)) from None
    entry = dict(_configured_driver(request.config, request.driver_name)) if request.config else {}
    if request.driver_user is not None:
        entry["user"] = request.driver_user
    env = entry.pop("env", {})
    entry.pop("command", None)
    return DriverUnderTest(
        argv,
        env,
        entry,
        relaxed=request.relaxed,
        health_hook=request.health_hook,
        expect=request.expect,
        health_watch_s=request.health_watch_s,
        cdi_dirs=request.cdi_dirs,
    )


def _dra(request: Request) -> int:
    """The DRA judge (dra_matrix.py): a driver's devices as a DRA pool (--config's first
    dra.drivers entry, or with --driver alone every resource the driver declares), judged by real
    DRA managers and API servers."""
    from . import dra_matrix  # the Kubernetes-side imports only when asked for

    sel = request.selection
    others = [flag for flag, given in (
        ("--plugin", request.plugin), ("--socket", request.socket), ("--judge", sel.judges),
        ("--profile", sel.profiles), ("--kubelet", sel.kubelets), ("--registration", sel.registrations),
        ("--quick", sel.quick), ("--expect", request.expect), ("--prebuild", request.prebuild),
        ("--health-watch", request.health_watch_s), ("--cdi-dir", request.cdi_dirs),
    ) if given]  # fmt: skip
    if others:
        raise UsageError(f"{', '.join(others)} do not apply to --dra (docs/compat.md, DRA)")
    settings, pool, env = _dra_settings(request)

    def run_rows(pairs: list[Pair], rows: list[str], progress: Progress) -> Awaitable[list[Result]]:
        return dra_matrix.run_dra_matrix(
            settings, pool["name"], pairs, rows, request.cell_timeout_s, progress, request.health_hook, env
        )

    source = request.driver if request.driver is not None else str(request.config)
    what = f"DRA driver {pool['name']} of {source} (kubelet/API server)"
    said = f"DRA driver {pool['name']}: {', '.join(pool['resources'])}"
    return _dra_rows(request, list(dra_matrix.SCENARIOS), "DRA scenario", "scenario", what, run_rows, said)


def _dra_rows(
    request: Request,
    known: list[str],
    kind: str,
    row_label: str,
    what: str,
    run_rows: Callable[[list[Pair], list[str], Progress], Awaitable[list[Result]]],
    said: str = "",
) -> int:
    """The rows chosen of ``known`` at the pairs chosen, run by ``run_rows``, reported."""
    from . import dra_matrix
    from .upstream.releases import JudgeUnavailable

    sel = request.selection
    unknown = sorted(set(sel.scenarios) - set(known))
    if unknown:
        raise UsageError(f"unknown {kind} {', '.join(unknown)}; choose from {', '.join(known)}")
    try:
        pairs = dra_matrix.choose_pairs(list(sel.dra_pairs))
    except ValueError as err:
        raise UsageError(str(err)) from None
    rows = [r for r in known if not sel.scenarios or r in sel.scenarios]
    sys.stderr.write(f"devshim compat: {dra_matrix.requirements(pairs)}\n")
    if said:
        sys.stderr.write(f"devshim compat: {said}\n")

    kept = _sharded(request, [(row, dra_matrix.pair_name(pair)) for pair in pairs for row in rows])

    async def run() -> list[Result]:
        # Pair by pair, each with the rows of this run: a pair none of whose cells it runs
        # starts no API server.
        progress, results = _progress(len(kept)), []
        for pair in pairs:
            chosen = [row for row in rows if (row, dra_matrix.pair_name(pair)) in kept]
            if chosen:
                results += await run_rows([pair], chosen, progress)
        return results

    try:
        results = _run_cells(run())
    except JudgeUnavailable as err:
        raise UsageError(str(err)) from None
    columns = [dra_matrix.pair_name(p) for p in pairs]
    return _report(request, results, rows, columns, row_label, what)


def _dra_settings(request: Request) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """devshim's settings for the DRA judge, the pool judged and the driver's env (for the health
    hook). --config as written (its first dra.drivers entry; --driver replaces its driver's
    command); --driver alone: the driver as the device-plugin matrix runs it, its pool every
    resource it declares at start."""
    if request.driver is not None and not shlex.split(request.driver):
        raise UsageError("--driver: the command is empty")
    if request.config is None:
        if request.driver is None:
            raise UsageError(
                "--dra judges --driver COMMAND, or the driver and DRA pool of --config FILE "
                "(drivers and dra.drivers)"
            )
        return _probed_pool(request)
    settings = _raw_settings(request.config)
    pools = (settings.get("dra") or {}).get("drivers") or []
    if not pools or not isinstance(pools[0], dict) or not pools[0].get("name"):
        raise UsageError(f"--config {request.config} has no dra.drivers entry to judge (docs/dra.md)")
    if request.driver is not None:
        name = _configured_driver(request.config, request.driver_name)["name"]
        settings["drivers"] = [
            {**d, "command": shlex.split(request.driver)} if d.get("name") == name else d
            for d in settings.get("drivers") or []
        ]
    return settings, dict(pools[0]), {}


def _probed_pool(request: Request) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    from shim.names import driver_name_problem

    from .driver_world import DRIVER_NAME, declared_resources, process_entry

    assert request.driver is not None
    driver = driver_under_test(request, shlex.split(request.driver))
    said = f"the driver starts once to say its resources; it runs {driver.describe()}"
    sys.stderr.write(f"devshim compat: {said}\n")
    try:
        resources = _run_cells(declared_resources(driver))
    except Failed as failed:
        raise UsageError(f"--driver {request.driver}: {failed}") from None
    name = resources[0].split("/")[0].lower()  # the resources' domain, e.g. example.com
    if (problem := driver_name_problem(name)) is not None:
        raise UsageError(f"the domain {name!r} of {resources[0]} is no DRA driver name ({problem}): "
                         "give --config with a dra.drivers entry naming one")  # fmt: skip
    pool = {"name": name, "resources": resources}
    settings = {"drivers": [process_entry(driver, DRIVER_NAME, resources)], "dra": {"drivers": [pool]}}
    return settings, pool, dict(driver.env)


def _raw_settings(config: Path) -> dict[str, Any]:
    """--config as written (the DRA judge fills in its folders and node per cell)."""
    import yaml

    try:
        loaded = yaml.safe_load(config.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise UsageError(f"--config {config}: {err}") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"--config {config}: not a mapping of settings")
    return loaded


@functools.cache  # read once per run: the command and the entry both come from it
def _configured_driver(config: Path, driver_name: str | None) -> dict[str, Any]:
    """The drivers[] entry of --config that --driver-name names (or the only one), as a dict."""
    from shim.configfile import ConfigError
    from shim.settings import Settings

    try:
        # The driver's entry alone matters here: a DRA section (which needs the node's name) is
        # --dra's to judge.
        drivers = Settings.load(config_file=config, dra={"drivers": []}).drivers
    except ConfigError as err:
        raise UsageError(f"--config {config}: {err}") from None
    names = [d.name for d in drivers]
    if driver_name is not None:
        chosen = [d for d in drivers if d.name == driver_name]
    else:
        chosen = drivers if len(drivers) == 1 else []
    if not chosen:
        which = f"no driver {driver_name!r}" if driver_name else f"{len(drivers)} drivers"
        raise UsageError(f"--config {config} has {which} (drivers: {', '.join(names) or 'none'}); "
                         "name one with --driver-name")  # fmt: skip
    return chosen[0].model_dump(mode="json", exclude_unset=False)


def _driver(
    request: Request, argv: list[str]
) -> tuple[list[Result], list[str], list[str], str, DriverUnderTest]:
    sel = request.selection
    modes = sel.modes()
    try:
        cells = driver_cells(sel.scenarios or None, modes)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if sel.quick:
        order = list(SCENARIOS)
        cells = [(s, m) for s, m in cells if in_default_subset(m, order.index(s))]
    if not cells:
        raise UsageError("the filters select no cell")
    rows = [s for s in SCENARIOS if any(c[0] == s for c in cells)]
    kept = _sharded(request, [(s, m.id) for s, m in cells])
    cells = [(s, m) for s, m in cells if (s, m.id) in kept]
    driver = driver_under_test(request, argv)
    sys.stderr.write(f"devshim compat: {len(cells)} cells for driver {shlex.join(argv)}\n")
    sys.stderr.write(f"devshim compat: the driver runs {driver.describe()}\n")
    results = _run_cells(
        run_driver_matrix(driver, cells, timeout_s=request.cell_timeout_s, progress=_progress(len(cells)))
    )
    return results, rows, [m.id for m in modes], f"driver: {shlex.join(argv)}", driver


def _plugin(request: Request) -> tuple[list[Result], list[str], list[str], str]:
    sel = request.selection
    try:
        cells = plugin_cells(sel.scenarios or None, sel.profiles or None)
    except ValueError as err:
        raise UsageError(str(err)) from None
    rows = [c for c in PLUGIN_CHECKS if any(cell[0] == c for cell in cells)]
    columns = list(dict.fromkeys(profile for _, profile in cells))
    kept = _sharded(request, cells)
    cells = [cell for cell in cells if cell in kept]
    plugin = PluginUnderTest(command=request.plugin, socket=request.socket, change_hook=request.health_hook)
    what = f"plugin: {request.plugin}" if request.plugin else f"socket: {request.socket}"
    sys.stderr.write(f"devshim compat: {len(cells)} cells for {what}\n")
    results = _run_cells(
        run_plugin_matrix(plugin, cells, timeout_s=request.cell_timeout_s, progress=_progress(len(cells)))
    )
    return results, rows, columns, what


def _run_cells(cells: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(cells), and nothing the plugin or driver under test started outlives it."""
    with orphans_ended():
        return asyncio.run(cells)


def quiet_logs(verbose: bool) -> None:
    """devshim's own log goes to stderr only with --verbose: the report is the output."""
    logger.remove()
    if verbose:
        logger.add(sys.stderr, level="INFO")


def _dra_plugin(request: Request) -> int:
    """The DRA judge for a DRA kubelet plugin not behind devshim (dra_plugin_checks.py): started
    from --dra-plugin's command per cell, under real DRA managers and API servers."""
    from . import dra_plugin_checks  # the Kubernetes-side imports only when asked for

    sel, command = request.selection, request.dra_plugin
    assert command is not None
    others = [flag for flag, given in (
        ("--config", request.config), ("--driver", request.driver), ("--driver-name", request.driver_name),
        ("--driver-user", request.driver_user), ("--plugin", request.plugin), ("--socket", request.socket),
        ("--health-hook", request.health_hook),
        ("--judge", sel.judges), ("--profile", sel.profiles), ("--kubelet", sel.kubelets),
        ("--registration", sel.registrations), ("--quick", sel.quick), ("--expect", request.expect),
        ("--prebuild", request.prebuild), ("--relaxed", request.relaxed),
        ("--health-watch", request.health_watch_s), ("--cdi-dir", request.cdi_dirs),
    ) if given]  # fmt: skip
    if others:
        raise UsageError(f"--dra-plugin runs the plugin from its command; {', '.join(others)} do not apply")
    try:
        argv = shlex.split(command)
    except ValueError as err:  # an unclosed quote
        raise UsageError(f"--dra-plugin: {err}") from None
    if not argv:
        raise UsageError("--dra-plugin: the command is empty")

    def run_rows(pairs: list[Pair], rows: list[str], progress: Progress) -> Awaitable[list[Result]]:
        return dra_plugin_checks.run_dra_plugin_matrix(command, pairs, rows, request.cell_timeout_s, progress)

    what = f"DRA plugin: {command} (kubelet/API server)"
    return _dra_rows(request, list(dra_plugin_checks.CHECKS), "DRA plugin check", "check", what, run_rows)

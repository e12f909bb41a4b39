"""The upstream judge: the driver scenarios and plugin checks with the kubelet's real device
manager (shim.compat.upstream), exactly as `devshim compat --judge` runs them.

By default every scenario runs against the oldest and the newest release devshim carries, for
devshim in front of four drivers (the lifecycle test driver, the sim, devfs, and the legacy
adapter in front of the Go legacy plugin) and for the Go legacy plugin on its own;
`--full-matrix` runs every release. Each cell passes or skips for a reason listed here, so a new
skip fails the suite. Needs root (mount namespaces) and Go (the harness build: minutes cold,
seconds warm; docs/toolchains.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from shim.compat.driver_world import DriverUnderTest
from shim.compat.plugin_world import PluginUnderTest
from shim.compat.results import Failed, Skip
from shim.compat.upstream import releases as upstream
from shim.compat.upstream.harness import Container, Pod
from shim.compat.upstream.matrix import run_judged_cell
from shim.compat.upstream.plugin_checks import CHECKS, run_judged_plugin_cell
from shim.compat.upstream.scenarios import LONG, REMOVAL_GRACE_S, SCENARIOS
from tests.support import AS_ROOT, DRIVERS, ROOT
from tests.support.judge import DEFAULT, RELEASES
from tests.support.legacy import FLIP, python_plugin
from tests.support.unix import short_temp_dir

HEALTH_HOOK_SIM = 'echo "health $DEVSHIM_COMPAT_RESOURCE $DEVSHIM_COMPAT_DEVICE Unhealthy" >> "$SIM_CONTROL"'

# Why a cell may skip; any other skip fails the test.
SKIPS = {
    "health_change": ("no --health-hook given",),
    "preferred_allocation": ("declares no resource with preferred allocation",),
    "prestart": ("declares no resource with pre-start",),
    "deallocate": ("declares no resource with deallocate",),
    "post_stop": ("no kubelet release serves v1beta2", "declares no resource with post-stop"),
    "upgrade": ("no release newer",),
    "downgrade": ("no release newer",),
}
PLUGIN_SKIPS = {"options": "judges it", "message_limit": "judges it"}


@pytest.mark.timeout(upstream.BUILD_TIMEOUT_S * 2)
def test_the_harnesses_build(judge: dict[upstream.Release, Path]) -> None:
    """First, so a cold build (minutes per release) has its own timeout: every release's harness
    is an executable in the cache."""
    for release, binary in judge.items():
        assert binary.is_file() and os.access(binary, os.X_OK), release.name
        assert binary.parent.name.startswith(release.version)


@pytest.fixture
def sim_driver(tmp_path: Path) -> DriverUnderTest:
    control = tmp_path / "sim.ctl"
    config = (
        (ROOT / "examples" / "sim.yaml")
        .read_text()
        .replace("control_file: sim.ctl", f"control_file: {control}")
    )
    (tmp_path / "sim.yaml").write_text(config)
    env = {**os.environ, "SIM_CONTROL": str(control)}
    argv = [sys.executable, "-m", "devshim_adapters.sim", "--config", str(tmp_path / "sim.yaml")]
    return DriverUnderTest(argv, env=env, entry=AS_ROOT, health_hook=HEALTH_HOOK_SIM)


def lifecycle_driver() -> DriverUnderTest:
    return DriverUnderTest(
        [sys.executable, str(DRIVERS / "lifecycle.py")],
        entry=AS_ROOT,
        health_hook='kill -USR1 "$DEVSHIM_COMPAT_DRIVER_PID"',
    )


def devfs_driver(tmp_path: Path) -> DriverUnderTest:
    config = tmp_path / "devfs.json"
    config.write_text(
        json.dumps({"groups": [{"resource": "example.com/nullish", "paths": ["/dev/null", "/dev/zero"]}]})
    )
    return DriverUnderTest(
        [sys.executable, "-m", "devshim_adapters.devfs", "--config", str(config)], entry=AS_ROOT
    )


def legacy_driver(private: Path, goplug: Path) -> DriverUnderTest:
    plugin = [str(goplug), "-dir", str(private), "-preferred", "-prestart"]
    return DriverUnderTest(
        [sys.executable, "-m", "devshim_adapters.legacy", "--kubelet-dir", str(private)]
        + ["--resource", "example.com/goplug", "--", *plugin],
        entry=AS_ROOT,
    )


def newest(release: upstream.Release, registration: str) -> bool:
    return release == DEFAULT[-1]


def cell_params(
    registrations: tuple[str, ...],
    *,
    long: bool = False,
    default: Callable[[upstream.Release, str], bool] = newest,
) -> list[object]:
    """Every (scenario, release, registration); outside the default pair, or where `default`
    says no (by default: all but the newest release, for the suite's time), full_matrix. A LONG
    row (over 5 minutes: the manager's grace) runs only with `long`, and then only in the full
    matrix, by classic registration, for the default pair."""
    return [
        pytest.param(
            scenario,
            release,
            registration,
            id=f"{scenario}-{release.name}-{registration}",
            marks=(
                [pytest.mark.full_matrix, pytest.mark.timeout(REMOVAL_GRACE_S + 120)]
                if scenario in LONG
                else []
                if release in DEFAULT and default(release, registration)
                else [pytest.mark.full_matrix]
            ),
        )  # fmt: skip
        for scenario in SCENARIOS
        if long or scenario not in LONG
        for release in RELEASES
        for registration in registrations
        if scenario not in LONG or (release in DEFAULT and registration == "classic")
    ]


async def judged(
    driver: DriverUnderTest,
    scenario: str,
    release: upstream.Release,
    registration: str,
    available: dict[upstream.Release, Path],
) -> None:
    """One cell as `devshim compat --judge` runs it: it passes or skips for a listed reason."""
    try:
        await run_judged_cell(driver, release, registration, scenario, available)
    except Skip as skip:
        allowed = SKIPS.get(scenario, ())
        assert any(reason in str(skip) for reason in allowed), f"unexpected skip: {skip}"
        pytest.skip(str(skip))


@pytest.mark.parametrize(
    ("scenario", "release", "registration"),
    # Both releases by classic registration, the newest by the plugin watcher too.
    cell_params(
        ("classic", "watcher"), long=True, default=lambda r, reg: reg == "classic" or r == DEFAULT[-1]
    ),
)
async def test_lifecycle_driver(
    scenario: str,
    release: upstream.Release,
    registration: str,
    judge: dict[upstream.Release, Path],
) -> None:
    await judged(lifecycle_driver(), scenario, release, registration, judge)


@pytest.mark.parametrize(("scenario", "release", "registration"), cell_params(("classic",)))
async def test_sim_driver(
    scenario: str, release: upstream.Release, registration: str, judge: dict[upstream.Release, Path],
    sim_driver: DriverUnderTest,
) -> None:  # fmt: skip
    await judged(sim_driver, scenario, release, registration, judge)


@pytest.mark.parametrize(("scenario", "release", "registration"), cell_params(("classic",)))
async def test_devfs_driver(
    scenario: str, release: upstream.Release, registration: str, judge: dict[upstream.Release, Path],
    tmp_path: Path,
) -> None:  # fmt: skip
    await judged(devfs_driver(tmp_path), scenario, release, registration, judge)


@pytest.mark.parametrize(("scenario", "release", "registration"), cell_params(("classic",)))
async def test_legacy_adapter_with_the_go_plugin(
    scenario: str, release: upstream.Release, registration: str, judge: dict[upstream.Release, Path],
    goplug: Path,
) -> None:  # fmt: skip
    """A legacy plugin behind the adapter, through every row; upgrade and downgrade are the
    cross-release cells: one release's checkpoint read by the next, devshim serving throughout."""
    with short_temp_dir("ds-priv-") as private:
        await judged(legacy_driver(private, goplug), scenario, release, registration, judge)


@pytest.mark.parametrize(
    ("check", "release"),
    [
        pytest.param(c, r, id=f"{c}-{r.name}", marks=[] if r in DEFAULT else [pytest.mark.full_matrix])
        for c in CHECKS
        for r in RELEASES
    ],
)
async def test_go_plugin(
    check: str, release: upstream.Release, judge: dict[upstream.Release, Path], goplug: Path
) -> None:
    """The Go legacy plugin passes every plugin check with the real manager as its kubelet."""
    plugin = PluginUnderTest(
        f"{shlex.quote(str(goplug))} -dir {{dir}} -preferred -prestart", change_hook=FLIP
    )
    try:
        await run_judged_plugin_cell(plugin, release, check, judge)
    except Skip as skip:
        assert check in PLUGIN_SKIPS and PLUGIN_SKIPS[check] in str(skip), f"unexpected skip: {skip}"
        pytest.skip(str(skip))


# The Python plugin (re-registering on a kubelet restart, as the judge's rows need) with one
# bug, the row it must fail under the real manager and why; with no bug it passes that row.
PLUGIN_BUGS = {
    "leaked-list-loop": ("change_after_dropped_stream", "a list loop left running for the dropped stream"),
    "socket-per-second": ("crash_restart", "did not count 3 example.com/pyplug allocatable again"),
}


@pytest.mark.parametrize("bug", ["", *PLUGIN_BUGS])
async def test_a_plugin_bug_fails_its_row_with_the_real_manager(
    bug: str, judge: dict[upstream.Release, Path], stubs: Path
) -> None:
    """A public plugin's bug (docs/compat.md, plugin checks) fails its row under the newest
    release's real device manager too, not only in the model; the same plugin without it passes."""
    plugin = python_plugin(stubs, {"PY_BUG": bug, "PY_REREGISTER": "1"})
    rows = [row for row, _ in PLUGIN_BUGS.values()] if not bug else [PLUGIN_BUGS[bug][0]]
    for row in rows:
        if not bug:
            await run_judged_plugin_cell(plugin, DEFAULT[-1], row, judge)
            continue
        with pytest.raises(Failed) as failed:
            await run_judged_plugin_cell(plugin, DEFAULT[-1], row, judge)
        assert PLUGIN_BUGS[bug][1] in str(failed.value), str(failed.value)


def test_each_release_module_pins_its_release() -> None:
    """Every judges/k8s-1.NN module requires k8s.io/kubernetes v1.NN.P and replaces each staging
    module with the published v0.NN.P (scripts/k8s_gomod.py), and goes through the harness."""
    assert [r.minor for r in RELEASES] == sorted({r.minor for r in RELEASES})
    assert len(RELEASES) >= 4
    for release in RELEASES:
        text = (release.folder / "go.mod").read_text()
        assert release.folder.name == f"k8s-1.{release.minor}"
        staging = f"v0.{release.minor}.{release.version.split('.')[2]}"
        assert f"k8s.io/api => k8s.io/api {staging}" in text
        assert f"k8s.io/kubelet => k8s.io/kubelet {staging}" in text
        assert "devshim.example/judges/harness => ../harness" in text


async def test_harness_reports_the_release_it_links_and_refuses_bad_requests(
    judge: dict[upstream.Release, Path],
) -> None:
    """The built binary links the release its go.mod names; a request it cannot serve gets an
    error reply naming it, and the harness keeps answering."""
    for release in DEFAULT:
        process = await asyncio.create_subprocess_exec(
            str(judge[release]), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        lines = [
            b'{"id": 1, "op": "version"}\n',
            b'{"id": 2, "op": "capacity"}\n',
            b"not json\n",
            b'{"id": 3, "op": "launch"}\n',
            b'{"id": 4, "op": "stop"}\n',
        ]
        out, _ = await process.communicate(b"".join(lines))
        replies = [json.loads(line) for line in out.splitlines()]
        assert replies[0] == {"id": 1, "ok": True, "result": {"release": release.version}}
        assert replies[1]["ok"] is False and "capacity before start" in replies[1]["error"]
        assert replies[2]["ok"] is False and "not a request" in replies[2]["error"]
        assert replies[3]["ok"] is False and 'unknown op "launch"' in replies[3]["error"]
        assert replies[4] == {"id": 4, "ok": True}
        assert process.returncode == 0


def test_pod_wire_form() -> None:
    """The harness reads pods in this form (judges/harness/protocol.go)."""
    pod = Pod("u", "p", [Container("c", {"example.com/x": 2})], init_containers=[Container("i")])
    assert pod.wire() == {
        "uid": "u", "name": "p", "namespace": "default",
        "containers": [{"name": "c", "requests": {"example.com/x": 2}}],
        "init_containers": [{"name": "i", "requests": {}}],
    }  # fmt: skip


def devshim_compat(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shim", "compat", *args], capture_output=True, text=True, timeout=timeout_s
    )


def test_devshim_compat_judges_a_driver_and_a_plugin_as_a_real_process(
    judge: dict[upstream.Release, Path], goplug: Path, tmp_path: Path
) -> None:
    """`devshim compat --judge` as users run it: it says what it needs, finds the harnesses in
    the cache, passes the sim and the Go plugin, and --prebuild lists the cached binaries."""
    judges = [arg for release in DEFAULT for arg in ("--judge", release.name)]
    prebuilt = devshim_compat(*judges, "--prebuild")
    assert prebuilt.returncode == 0, prebuilt.stderr
    assert "runs as root, in private mount namespaces" in prebuilt.stderr
    assert prebuilt.stdout.splitlines() == [f"{r.name} ({r.version}): {judge[r]}" for r in DEFAULT]

    sim = f"{sys.executable} -m devshim_adapters.sim --config {ROOT / 'examples' / 'sim.yaml'}"
    rows = ["--scenario=register", "--scenario=allocate", "--scenario=prestart", "--scenario=upgrade"]
    report = tmp_path / "driver.json"
    run = devshim_compat(
        *judges,
        "--driver",
        sim,
        "--driver-user",
        "root",
        *rows,
        "--registration=classic",
        "--json",
        str(report),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    cells = json.loads(report.read_text())["cells"]
    assert {c["mode"] for c in cells} == {f"{r.name}/classic" for r in DEFAULT}
    assert [c for c in cells if c["status"] != "pass"] == [
        c for c in cells if c["scenario"] == "upgrade" and c["mode"].startswith(DEFAULT[-1].name)
    ]

    plugin = f"{shlex.quote(str(goplug))} -dir {{dir}}"
    checks = ["--scenario=serves_before_register", "--scenario=allocate"]
    run = devshim_compat(*judges, "--plugin", plugin, *checks)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 cells run: 4 passed, 0 failed, 0 skipped" in run.stdout

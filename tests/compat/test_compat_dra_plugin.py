"""`devshim compat --dra --dra-plugin CMD` as a real process (shim.compat.dra_plugin_checks): the
scripted DRA plugin (tests/support/dra_plugin.py), not behind devshim, passes every check under a
real DRA manager and API server (the newest pair by default, every supported pair with
--full-matrix); the same plugin advertising v1.DRAPlugin but serving only v1beta1 fails exactly
the rows that need the service it advertised; flags that do not make a run exit 2. With
--full-matrix, upstream's own DRA test driver (k8s.io/kubernetes test/e2e/dra/test-driver) is
judged as a real peer at every pair."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shim.compat.command import Request, Selection, UsageError, run
from shim.compat.dra_matrix import choose_pairs, supported_pairs
from shim.compat.dra_plugin_checks import CHECKS
from shim.compat.dra_plugin_world import PluginCell
from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases
from tests.support.compat_run import compat, table_row
from tests.support.devshim_process import DEVSHIM
from tests.support.dra_judge import build
from tests.support.toolchains import toolchain

PLUGIN = Path(__file__).resolve().parents[1] / "support" / "dra_plugin.py"
NEWEST = "1.37/1.37"
# The rows that call the plugin's DRAPlugin service (services directly, the rest through the
# DRA manager).
CALLING = {"services", "prepare", "shared", "kubelet_restart", "plugin_restart"}
BUGGY = {"versions": ["v1.DRAPlugin"], "serves": ["v1beta1.DRAPlugin"]}


def plugin(script: dict[str, Any]) -> str:
    """The scripted plugin's command line, every path from the cell's placeholders."""
    return shlex.join([
        sys.executable, str(PLUGIN), "--driver", "gpu.example.com", "--node", "{node}",
        "--registry", "{registry}", "--socket", "{plugins}/dra.sock", "--cdi-dir", "{cdi}",
        "--record", "{plugins}/calls.jsonl", "--kubeconfig", "{kubeconfig}", "--script", json.dumps(script),
    ])  # fmt: skip


def pair_param(name: str) -> Any:
    marks = () if name == NEWEST else (pytest.mark.full_matrix,)
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("pair", [pair_param(f"1.{k.minor}/1.{a.minor}") for k, a in supported_pairs()])
def test_a_good_plugin_passes_every_check(tmp_path: Path, pair: str) -> None:
    """Registered, every advertised service served, its slice published, prepared claims that
    resolve through the CDI library, shared and across both restarts."""
    [(kubelet, server)] = choose_pairs([pair])
    build(kubelet)  # outside the run's own time (the command builds what is missing too)
    run = compat(tmp_path, "--dra", "--dra-plugin", plugin({}), "--dra-pair", pair)
    assert run.code == 0, run.stdout
    column = f"kubelet-1.{kubelet.minor}/apiserver-1.{server.minor}"
    assert [(c["scenario"], c["mode"], c["status"]) for c in run.cells] == [
        (check, column, "pass") for check in CHECKS
    ]
    assert f"and kube-apiserver and etcd of 1.{server.minor}" in run.stderr
    assert "gpu.example.com as a DRAPlugin" in run.stdout


@pytest.mark.full_matrix  # 13 s of the default suite's 15 minutes: with --full-matrix
@pytest.mark.parametrize("pair", [pair_param(f"1.{k.minor}/1.{a.minor}") for k, a in supported_pairs()])
def test_a_plugin_advertising_v1_but_serving_v1beta1_fails_the_rows_it_should(
    tmp_path: Path, pair: str
) -> None:
    """From 1.34 the kubelet takes v1.DRAPlugin from its list: registering and publishing work,
    everything that calls the plugin fails, naming the service. 1.33 knows no v1 and calls
    v1alpha4.Node instead, so register fails there too. Each failed cell has its repeat command."""
    [(kubelet, server)] = choose_pairs([pair])
    build(kubelet)
    run = compat(tmp_path, "--dra", "--dra-plugin", plugin(BUGGY), "--dra-pair", pair)
    assert run.code == 1
    passing = {"publish"} if kubelet.minor == 33 else {"register", "publish"}
    failed = run.by_status("fail")
    assert {check for check, _ in failed} == set(CHECKS) - passing, run.stdout
    called = "v1alpha4.Node" if kubelet.minor == 33 else "v1.DRAPlugin"
    for (check, _), reason in failed.items():
        assert (called if check in CALLING - {"services"} else "v1.DRAPlugin") in reason, reason
        assert "--- the plugin's log, the end:" in reason, reason  # what its author reads next
    assert {c["scenario"] for c in run.cells if c["status"] == "pass"} == passing
    assert table_row(run.stdout, "services").split()[1] == "FAIL"
    column = f"kubelet-1.{kubelet.minor}/apiserver-1.{server.minor}"
    repeat = shlex.join(["devshim", "compat", "--dra", "--dra-plugin", plugin(BUGGY), "--scenario",
                         "services", "--dra-pair", column])  # fmt: skip
    assert f"  {repeat}" in run.stdout.splitlines(), run.stdout


def upstream_test_driver() -> Path:
    """k8s.io/kubernetes' own DRA test driver (test/e2e/dra/test-driver: the kubeletplugin
    helper its e2e tests run), built from the module judges/k8s-1.37 pins, into the judge cache
    beside that release's programs."""
    [release] = [r for r in releases.releases() if r.minor == 37]
    if not release.binary(releases.DRA_TEST_DRIVER_PROGRAM).is_file():
        toolchain("go", "upstream's DRA test driver")
    return releases.build_dra_test_driver(release, log=False)


@pytest.mark.full_matrix
@pytest.mark.parametrize("pair", [f"1.{k.minor}/1.{a.minor}" for k, a in supported_pairs()])
def test_upstreams_own_test_driver_passes_every_check(tmp_path: Path, pair: str) -> None:
    """A real peer: registered with the health services too, two devices published by the
    kubeletplugin helper, prepared with CDI specs of its own. It makes only the parent of its
    socket's folder, so the command makes that first (and reads $DEVSHIM_COMPAT_PLUGINS)."""
    [(kubelet, _)] = choose_pairs([pair])
    build(kubelet)
    driver = "test-driver.cdi.k8s.io"
    command = shlex.join([
        "sh", "-c", f'mkdir -p "$DEVSHIM_COMPAT_PLUGINS/{driver}" && exec "$0" "$@"',
        str(upstream_test_driver()), "--drivername", driver, "kubelet-plugin",
        "--plugin-registration-path", "{registry}", "--datadir", "{plugins}", "--cdi-dir", "{cdi}",
        "--node-name", "{node}", "--num-devices", "2",
    ])  # fmt: skip
    run = compat(tmp_path, "--dra", "--dra-plugin", command, "--dra-pair", pair)
    assert run.code == 0, run.stdout
    assert [(c["scenario"], c["status"]) for c in run.cells] == [(check, "pass") for check in CHECKS]
    assert "v1.DRAResourceHealth" in run.stdout


def test_dra_plugin_without_dra_exits_2_naming_the_fix() -> None:
    done = subprocess.run(
        [*DEVSHIM, "compat", "--dra-plugin", "x"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert "--dra-plugin is judged by the DRA judge: give --dra too" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"config": Path("c.yaml")}, "--config do not apply"),
        ({"driver": "y"}, "--driver do not apply"),
        ({"dra_plugin": " "}, "--dra-plugin: the command is empty"),
        ({"dra_plugin": "p --name 'x"}, "--dra-plugin: No closing quotation"),
        ({"selection": Selection(scenarios=["allocate"])}, "unknown DRA plugin check allocate"),
        ({"selection": Selection(dra_pairs=["1.33/1.37"])}, "unknown DRA pair 1.33/1.37"),
    ],
    ids=["config", "driver", "empty", "unclosed-quote", "unknown-check", "unsupported-pair"],
)
def test_flags_that_make_no_run_are_refused_before_anything_starts(given: dict[str, Any], says: str) -> None:
    """In process, for time (a usage error is exit 2 as above)."""
    with pytest.raises(UsageError, match=re.escape(says)):
        run(Request(**{"dra": True, "dra_plugin": "x", **given}))


def test_the_command_gets_the_cells_places_as_placeholders_and_environment(tmp_path: Path) -> None:
    """Each placeholder in any argument, and the same as environment variables, for a plugin
    that reads its settings from there."""
    plane = ControlPlane(37, tmp_path / "plane")
    [(kubelet, _)] = choose_pairs([NEWEST])
    cell = PluginCell("p --at={plugins}/dra.sock '{node} {cdi}' {registry} {kubeconfig}", plane, kubelet,
                      tmp_path / "dramanager", tmp_path, "compat-9", env={"PATH": "/bin"})  # fmt: skip
    kubeconfig = str(plane.admin_kubeconfig)
    assert cell.argv() == [
        "p", f"--at={tmp_path}/plugins/dra.sock", f"compat-9 {tmp_path}/cdi", f"{tmp_path}/registry",
        kubeconfig,
    ]  # fmt: skip
    assert cell.environment() == {
        "PATH": "/bin",
        "DEVSHIM_COMPAT_REGISTRY": f"{tmp_path}/registry",
        "DEVSHIM_COMPAT_PLUGINS": f"{tmp_path}/plugins",
        "DEVSHIM_COMPAT_CDI": f"{tmp_path}/cdi",
        "DEVSHIM_COMPAT_NODE": "compat-9",
        "KUBECONFIG": kubeconfig,
    }

"""`devshim check-config FILE`: what loads but is probably a mistake is said, and a driver's own
configuration given by mistake gets one line saying so (the real command, as a process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.devshim_process import DEVSHIM

ROOT = Path(__file__).parents[2]


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEVSHIM, "check-config", *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def write(tmp_path: Path, settings: object) -> str:
    path = tmp_path / "devshim.yaml"
    path.write_text(settings if isinstance(settings, str) else json.dumps(settings))
    return str(path)


@pytest.mark.parametrize(
    ("settings", "warning"),
    [
        pytest.param("", "warning: it serves nothing: no resources and no drivers", id="empty"),
        pytest.param(
            {"drivers": [{"name": "vendor", "command": ["vendor-driver-nobody-has"]}]},
            "warning: drivers[0] (vendor): 'vendor-driver-nobody-has' is not on this machine's PATH here",
            id="driver-not-on-path",
        ),
        pytest.param(
            {"drivers": [{"name": "vendor", "command": ["/opt/vendor/bin/driver"]}]},
            "warning: drivers[0] (vendor): '/opt/vendor/bin/driver' is not an executable file here",
            id="driver-path-missing",
        ),
        pytest.param(
            {
                "drivers": [{"name": "sim", "command": [sys.executable], "resources": ["example.com/sim"]}],
                "dra": {
                    "node_name": "n1",
                    "drivers": [{"name": "gpu.example.com", "resources": ["example.com/gpu"]}],
                },
            },
            "warning: dra.drivers[0] (gpu.example.com): example.com/gpu is not a static resource, and no "
            "driver may: each lists its resources, and none lists it; its pool stays empty without it",
            id="dra-pool-of-nothing",
        ),
        pytest.param(
            {
                "drivers": [{"name": "sim", "command": [sys.executable]}],
                "dra": {
                    "node_name": "n1",
                    "drivers": [{"name": "gpu.example.com", "resources": ["example.com/gpu"]}],
                },
            },
            "warning: dra.drivers[0] (gpu.example.com): example.com/gpu is not a static resource, unless a "
            "driver declares it",
            id="dra-pool-maybe",
        ),
    ],
)
def test_likely_mistakes_are_warned_about_and_fail_under_strict(
    tmp_path: Path, settings: object, warning: str
) -> None:
    path = write(tmp_path, settings)
    loose, strict = check(path), check("--strict", path)
    assert loose.returncode == 0 and f"{path}: valid; " in loose.stdout
    assert f"{path}: {warning}" in loose.stderr
    assert strict.returncode == 2 and f"{path}: {warning}" in strict.stderr


def test_a_driver_that_is_here_and_a_file_that_serves_draw_no_warning(tmp_path: Path) -> None:
    path = write(
        tmp_path, {"drivers": [{"name": "sim", "command": [sys.executable, "-m", "devshim_adapters.sim"]}]}
    )
    result = check("--strict", path)
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        pytest.param(
            {"drivers": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}]},
            "driver name(s) used twice: a",
            id="duplicate-driver-names",
        ),
        pytest.param(
            {
                "resources": [{"name": "example.com/x", "static": {"count": 1}}],
                "drivers": [{"name": "a", "command": ["x"], "resources": ["example.com/x"]}],
            },
            "driver 'a' lists example.com/x in its resources, but resources (static) has it",
            id="static-and-driver-serve-one-name",
        ),
    ],
)
def test_conflicts_are_errors(tmp_path: Path, settings: object, said: str) -> None:
    result = check(write(tmp_path, settings))
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr


def test_a_yaml_error_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "a: [1, 2\nb: 3\n")
    result = check(path)
    assert result.returncode == 2
    assert f'in "{path}", line 1, column 4' in result.stderr and "<unicode string>" not in result.stderr


@pytest.mark.parametrize("config", ["examples/sim.yaml", "devfs"])
def test_a_drivers_own_configuration_given_by_mistake_gets_one_line(tmp_path: Path, config: str) -> None:
    if config == "devfs":  # devfs's own configuration: groups of device paths
        config = write(tmp_path, {"groups": [{"resource": "example.com/x", "paths": ["/dev/null"]}]})
    result = check(config)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"devshim: {config} is not devshim's settings but, it seems, a driver's own configuration"
    )

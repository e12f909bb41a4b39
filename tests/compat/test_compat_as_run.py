"""A green `devshim compat` means the driver works under `devshim run` with the same config.

Two drivers used to pass every compat cell and then fail under run: one granting LD_PRELOAD
(the floor's env.loader rule refuses it, under any allowlist), one that needs a variable of its
own (run gives a driver exactly its configured `env`, not the caller's environment). Each is run
through both, with the same config, and the two agree; `--relaxed` is the explicit way back to
judging the protocol alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from shim.compat.fakekubelet import FakeKubelet
from tests.support import DRIVERS
from tests.support.compat_cell import run_cell
from tests.support.devshim_process import DEVSHIM, devshim

PRELOAD = "example.com/preload"
VENDOR = "example.com/vendor"
PRELOADING = [sys.executable, "-m", "devshim_adapters.sim", "--config-json",
              json.dumps({"resources": [{"name": PRELOAD, "count": 1,
                                         "grant": {"envs": {"LD_PRELOAD": "/opt/x.so"}}}]})]  # fmt: skip
NEEDS_ENV = [sys.executable, str(DRIVERS / "needs_env.py")]


def config(
    tmp_path: Path,
    command: list[str],
    env: dict[str, str] | None = None,
    *,
    resources: list[str],
    envs: list[str] | None = None,
) -> Path:
    """devshim's settings with one driver, as an operator would write them: the resources it
    serves, and the env names its grants may set."""
    entry: dict[str, Any] = {
        "name": "vendor",
        "user": "root",
        "command": command,
        **({"env": env} if env else {}),
    }
    entry["resources"] = resources
    if envs:
        entry["policy"] = {"envs": envs}
    path = tmp_path / "devshim.yaml"
    path.write_text(yaml.safe_dump({"drivers": [entry]}))
    return path


def test_compat_applies_the_floor_as_run_does_unless_relaxed(tmp_path: Path) -> None:
    """Undeclared, compat learns what the driver grants, but holds the floor as run does."""
    cell = run_cell(
        tmp_path, "allocate", "--driver", subprocess.list2cmdline(PRELOADING), "--driver-user", "root"
    )
    assert (cell.code, cell.status) == (1, "fail")
    assert "grant policy refuses envs['LD_PRELOAD']" in cell.reason
    assert "the floor's rule env.loader refuses it" in cell.reason
    assert "as `devshim run` runs it: no --config declaring it" in cell.stderr
    assert "; environment variables none" in cell.stderr
    cell = run_cell(tmp_path, "allocate", "--driver", subprocess.list2cmdline(PRELOADING), "--relaxed")
    assert (cell.code, cell.status) == (0, "pass")
    assert cell.reason == f"{PRELOAD} {PRELOAD.split('/')[1]}-0: env LD_PRELOAD=/opt/x.so"
    assert "relaxed (--relaxed)" in cell.stderr


def test_compat_gives_the_driver_only_the_configured_environment(tmp_path: Path) -> None:
    """Without VENDOR_HOME in the config the driver cannot start, even though this shell has it;
    with it, the allocate row shows the grant and --expect checks it."""
    shell_env = {**os.environ, "VENDOR_HOME": "/from/the/shell"}
    unset = config(tmp_path, NEEDS_ENV, resources=[VENDOR], envs=["VENDOR_HOME"])
    without = run_cell(tmp_path, "allocate", "--config", str(unset), env=shell_env)
    assert (without.code, without.status) == (1, "fail") and "VENDOR_HOME is not set" in without.reason
    given = {"VENDOR_HOME": "/opt/vendor"}
    configured = str(config(tmp_path, NEEDS_ENV, given, resources=[VENDOR], envs=["VENDOR_HOME"]))
    cell = run_cell(tmp_path, "allocate", "--config", configured, "--expect", f"{VENDOR}:env=VENDOR_HOME")
    assert (cell.code, cell.status) == (0, "pass"), cell
    assert cell.reason == f"{VENDOR} v-0: env VENDOR_HOME=/opt/vendor"
    assert "drivers[vendor]'s resources and grant policy; environment variables VENDOR_HOME" in cell.stderr
    cell = run_cell(tmp_path, "allocate", "--config", configured, "--expect", "env=OTHER_HOME")
    assert (cell.code, cell.status) == (1, "fail")
    assert cell.reason.startswith(f"{VENDOR}: the grant lacks env=OTHER_HOME (--expect)")


def test_a_malformed_expectation_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [*DEVSHIM, "compat", "--driver", "x", "--expect", "colour=red"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--expect 'colour=red': not [RESOURCE:]KIND=VALUE" in result.stderr


@pytest.mark.parametrize(
    ("command", "env", "outcome"),
    [
        pytest.param(PRELOADING, None, "refused", id="preloading"),
        pytest.param(NEEDS_ENV, {"VENDOR_HOME": "/opt/vendor"}, "granted", id="needs-env-configured"),
    ],
)
async def test_devshim_run_with_the_same_config_agrees(
    plugin_dir: Path, tmp_path: Path, kubelet: FakeKubelet, command: list[str], env: dict[str, str] | None,
    outcome: str,
) -> None:  # fmt: skip
    """What compat said above, `devshim run` does: the preloading grant is refused by the floor
    even where the policy names it, the configured environment reaches the driver."""
    resource = PRELOAD if command is PRELOADING else VENDOR
    envs = ["LD_PRELOAD"] if command is PRELOADING else ["VENDOR_HOME"]
    settings = config(tmp_path, command, env, resources=[resource], envs=envs)
    async with devshim("run", "--device-plugins-dir", str(plugin_dir), "--config", str(settings)):
        session = await kubelet.wait_for_plugin(resource, timeout=30)
        await session.wait_for_list(lambda devices: bool(devices), timeout=30)
        device = session.latest[0].id
        if outcome == "refused":
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await session.allocate([device])
            assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
            details = refused.value.details() or ""
            assert "grant policy refuses envs['LD_PRELOAD']" in details
            assert "the floor's rule env.loader refuses it" in details
        else:
            assert (await session.allocate([device])).envs == {"VENDOR_HOME": "/opt/vendor"}


def test_a_driver_declaring_only_names_devshim_refuses_fails_at_once_saying_why(tmp_path: Path) -> None:
    """`fpga` is no extended resource name (no domain): the register row fails with the reason
    instead of waiting out the start timeout (30 s) in every cell."""
    claiming = config(
        tmp_path,
        [sys.executable, str(DRIVERS / "claiming.py")],
        {"CLAIM_RESOURCES": '["fpga"]'},
        resources=["example.com/fpga"],
    )
    cell = run_cell(tmp_path, "register", "--config", str(claiming))
    assert (cell.code, cell.status) == (1, "fail")
    assert cell.reason.startswith("devshim refused every resource the driver declared: 'fpga': ")
    assert cell.seconds < 15, cell  # not the 30 s start timeout


def test_the_shipped_example_config_runs_as_its_comments_say(tmp_path: Path) -> None:
    """examples/devshim.yaml, from the repository root, as README and the file itself show it."""
    root = Path(__file__).parents[2]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    checked = subprocess.run(
        [*DEVSHIM, "check-config", "examples/devshim.yaml"], cwd=root, env=env, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    ran = run_cell(
        tmp_path, "allocate", "--config", "examples/devshim.yaml", "--driver-user", "root", cwd=root, env=env
    )
    assert (ran.code, ran.status) == (0, "pass"), ran
    assert "env SIM_DEVICES=" in ran.stdout  # the allocate row shows the grant

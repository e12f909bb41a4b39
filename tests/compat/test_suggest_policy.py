"""`devshim compat` suggests the declaration a driver's grants need (issue 41), as a process.

Without --config compat learns: the allowlists are not held (the floor is), and the declaration
the grants needed is printed as devshim's settings; fed back as --config, the same run passes.
With --config the declaration is held: a grant outside it fails the row, and the suggestion is
printed. `--suggest-policy` prints it on a passing run too. A grant the floor refuses is listed
under the floor by rule, never in the suggested allowlist: lifting a rule is the operator's call.

The driver is the simulator (a real driver subprocess) configured to grant one of each kind:
an env, a device node, a read-only mount and a CDI device, for every device alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support.compat_cell import run_cell
from tests.support.compat_run import compat

LAMP = "example.com/lamp"
GRANT: dict[str, Any] = {
    "envs": {"LAMP_DEVICES": "{ids}"},
    "device_nodes": [{"container_path": "/dev/lamp-{id}", "host_path": "/dev/null"}],
    "mounts": [{"container_path": "/opt/share", "host_path": "/usr/share", "read_only": True}],
    "cdi_devices": [f"{LAMP}={{id}}"],
}
# What those grants need declared, as compat suggests it.
NEEDED = {
    "envs": ["LAMP_CDI", "LAMP_DEVICES"],
    "device_nodes": ["/dev/null"],
    "mounts": ["/usr/share"],
    "cdi_kinds": [LAMP],
}
HEADER = (
    "the declaration this driver's grants needed (devshim's settings, docs/configuration.md, "
    '"Grant policy"):'
)
# The quick subset, on the newest kubelet and classic registration: the run learnt, then repeated.
QUICK = ("--quick", "--profile", "next", "--registration", "classic")
# The rows where a driver's grants are made and held (the learning run and its replay run only
# these: every other row is the matrix's business, not the declaration's).
GRANTING_ROWS = ("--scenario", "register", "--scenario", "allocate", "--scenario", "prestart")
FLOOR_HEADER = "Its grants also held what the floor refuses, which only `unsafe: {RULE: true}` lifts:"


def lamp(**grant: Any) -> list[str]:
    """The simulator serving two lamp devices, each granting GRANT (and ``grant``'s envs)."""
    envs = {**GRANT["envs"], **grant.get("envs", {})}
    # The CDI names it grants resolve in the spec it ships (protocol 1.2), whose edits the
    # declaration must allow as well.
    spec = {"kind": LAMP, "edits": {"envs": {"LAMP_CDI": "{ids}"}}}
    config = {"resources": [{"name": LAMP, "count": 2, "grant": {**GRANT, "envs": envs}, "cdi_spec": spec}]}
    return [sys.executable, "-m", "devshim_adapters.sim", "--config-json", json.dumps(config)]


def write(tmp_path: Path, settings: dict[str, Any], name: str = "devshim.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(settings))
    return path


def declared(command: list[str], policy: dict[str, Any]) -> dict[str, Any]:
    """devshim's settings with the lamp driver declared: its resource, and ``policy``."""
    return {
        "drivers": [
            {"name": "lamp", "user": "root", "command": command, "resources": [LAMP], "policy": policy}
        ]
    }


def suggestion(stdout: str) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The settings compat suggested (None: none printed), and the floor's rules it listed with
    the values that broke each."""
    if HEADER not in stdout:
        return None, {}
    text = stdout.split(HEADER, 1)[1]
    text, _, floor_text = text.partition(FLOOR_HEADER)
    floor = dict(line.strip().split(": ", 1) for line in floor_text.splitlines() if line.strip())
    return yaml.safe_load(text), floor


def test_compat_learns_the_declaration_and_the_same_run_passes_with_it(tmp_path: Path) -> None:
    """No --config: every granting cell (of one kubelet and path) passes and the declaration is
    printed, naming the driver's command, the resource it served and exactly what its grants
    held. That YAML as --config makes the same run pass, the declaration held this time, and
    prints no suggestion."""
    command = lamp()
    learnt = compat(
        tmp_path,
        "--driver",
        subprocess.list2cmdline(command),
        "--driver-user",
        "root",
        *QUICK,
        *GRANTING_ROWS,
    )
    assert learnt.code == 0 and learnt.summary["fail"] == 0, learnt.stdout
    assert "no --config declaring it: it serves what it declares, any grant above the floor" in learnt.stderr
    settings, floor = suggestion(learnt.stdout)
    assert settings == {
        "drivers": [
            {"name": "my-driver", "user": "root", "command": command, "resources": [LAMP], "policy": NEEDED}
        ]
    }
    assert floor == {} and FLOOR_HEADER not in learnt.stdout

    config = write(tmp_path, settings)
    held = compat(tmp_path, "--config", str(config), *QUICK, *GRANTING_ROWS)
    assert held.code == 0 and held.summary == learnt.summary, held.stdout
    assert "drivers[my-driver]'s resources and grant policy" in held.stderr
    assert suggestion(held.stdout) == (None, {})
    # The allocate row saw the whole grant, under the declaration.
    assert (
        f"saw: {LAMP} lamp-0: env LAMP_DEVICES=lamp-0, node /dev/null -> /dev/lamp-lamp-0 (rw), "
        f"mount /usr/share -> /opt/share (ro), cdi {LAMP}=lamp-0" in held.stdout
    )


def test_a_grant_outside_the_declaration_fails_the_row_and_the_suggestion_is_printed(tmp_path: Path) -> None:
    """--config declares the envs and the CDI kind alone: Allocate is refused at the device node,
    the row fails naming the setting that would allow it, and compat prints what the grants
    needed, under the config's own driver name."""
    command = lamp()
    config = write(tmp_path, declared(command, {"envs": ["LAMP_CDI", "LAMP_DEVICES"], "cdi_kinds": [LAMP]}))
    cell = run_cell(tmp_path, "allocate", "--config", str(config))
    assert (cell.code, cell.status) == (1, "fail")
    assert (
        "grant policy refuses device_nodes[0].host_path '/dev/null': not declared: "
        "drivers[lamp].policy.device_nodes would allow it, e.g. [/dev/null]" in cell.reason
    )
    assert "1 grant was refused; " + HEADER in cell.stdout
    settings, floor = suggestion(cell.stdout)
    assert settings == declared(command, NEEDED) and floor == {}


def test_suggest_policy_prints_the_declaration_on_a_passing_run(tmp_path: Path) -> None:
    """--config declaring exactly what is needed passes; with --suggest-policy the declaration
    is printed all the same (nothing was refused, so the header says nothing of refusals)."""
    command = lamp()
    config = write(tmp_path, declared(command, NEEDED))
    quiet = run_cell(tmp_path, "allocate", "--config", str(config))
    assert (quiet.code, quiet.status) == (0, "pass") and HEADER not in quiet.stdout
    cell = run_cell(tmp_path, "allocate", "--config", str(config), "--suggest-policy")
    assert (cell.code, cell.status) == (0, "pass")
    assert "refused" not in cell.stdout
    assert suggestion(cell.stdout) == (declared(command, NEEDED), {})


def test_a_grant_the_floor_refuses_is_listed_under_the_floor_and_never_suggested(tmp_path: Path) -> None:
    """The lamp grants PS4 too (bash runs it as it traces): even learning, the floor refuses it,
    so the row fails naming env.shell; the suggestion lists PS4 under env.shell and its allowlist
    holds only what the floor lets through."""
    command = lamp(envs={"PS4": "$(id >&2)"})
    cell = run_cell(
        tmp_path, "allocate", "--driver", subprocess.list2cmdline(command), "--driver-user", "root"
    )
    assert (cell.code, cell.status) == (1, "fail")
    assert "envs['PS4'] 'PS4': the floor's rule env.shell refuses it (" in cell.reason
    settings, floor = suggestion(cell.stdout)
    assert settings is not None
    (entry,) = settings["drivers"]
    assert entry["policy"] == NEEDED and "unsafe" not in entry["policy"]
    assert floor == {"env.shell": "PS4"}
    assert cell.stdout.rstrip().endswith(f"{FLOOR_HEADER}\n  env.shell: PS4")

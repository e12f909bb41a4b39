"""`devshim check-config FILE`: what each driver and static resource may grant is shown resource
by resource (any floor rule lifted in capitals), what loads but is probably a mistake is said,
and a driver's own configuration given by mistake gets one line saying so (the real command, as
a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.devshim_process import DEVSHIM

ROOT = Path(__file__).parents[2]
VENDOR = "example.com/vendor"


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
            {"drivers": [{"name": "vendor", "command": ["vendor-driver-nobody-has"], "resources": [VENDOR]}]},
            "warning: drivers[0] (vendor): 'vendor-driver-nobody-has' is not on this machine's PATH here",
            id="driver-not-on-path",
        ),
        pytest.param(
            {"drivers": [{"name": "vendor", "command": ["/opt/vendor/bin/driver"], "resources": [VENDOR]}]},
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
    """A driver this machine has, and a DRA pool of a resource a driver lists: nothing to say."""
    sim = {"name": "sim", "command": [sys.executable, "-m", "devshim_adapters.sim"], "resources": [VENDOR]}
    pool = {"name": "gpu.example.com", "resources": [VENDOR]}
    path = write(tmp_path, {"drivers": [sim], "dra": {"node_name": "n1", "drivers": [pool]}})
    result = check("--strict", path)
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        pytest.param(
            {
                "drivers": [
                    {"name": "a", "command": ["x"], "resources": ["example.com/x"]},
                    {"name": "a", "command": ["y"], "resources": ["example.com/y"]},
                ]
            },
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


# --- what each source may grant (issue 41) -----------------------------------------------------

SIM = "example.com/sim"
FPGA = "example.com/fpga"


def shown(stdout: str) -> list[str]:
    """The lines after the summary: what each source may grant."""
    return stdout.splitlines()[1:]


def test_check_config_shows_what_each_driver_and_static_resource_may_grant(tmp_path: Path) -> None:
    """Per driver, the resources it may serve; per resource, every allowlist in force ("none":
    nothing of that kind), with the setting it is read from: the driver's policy, a resource's
    own policy replacing it whole, a static grant's own declaration, or an empty one."""
    settings = {
        "resources": [
            {
                "name": "example.com/a",
                "static": {
                    "count": 2,
                    "grant": {
                        "envs": {"A_DEVICES": "{ids}"},
                        "device_nodes": [{"container_path": "/dev/a{id}", "host_path": "/dev/a{id}"}],
                    },
                },
            },
            {"name": "example.com/b", "static": {"count": 1}, "policy": {}},
        ],
        "drivers": [
            {
                "name": "sim",
                "command": [sys.executable],
                "user": "root",  # who it runs as by default: test_driver_identity.py
                "resources": [SIM, FPGA],
                "policy": {
                    "envs": ["SIM_DEVICES", "NVIDIA_*"],
                    "device_nodes": ["/dev/nvidia*"],
                    "cdi_kinds": ["nvidia.com/gpu"],
                },
                "resource_policies": {
                    FPGA: {
                        "mounts": ["/opt/fpga/**"],
                        "read_only_mounts": False,
                        "device_nodes": ["/dev/fpga*"],
                        "device_node_types": ["char", "block"],
                        "annotation_key_prefixes": ["fpga.example.com/"],
                    }
                },
            }
        ],
    }
    path = write(tmp_path, settings)
    result = check("--strict", path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines()[0].startswith(
        f"{path}: valid; serves example.com/a, example.com/b, driver sim"
    )
    assert shown(result.stdout) == [
        f"driver sim may serve {SIM}, {FPGA}",
        "  runs as root, as its user setting says",
        f"  {SIM}: its grants may hold, as drivers[sim].policy declares:",
        "    envs: SIM_DEVICES, NVIDIA_*",
        "    device_nodes: /dev/nvidia* (char devices)",
        "    mounts: none",
        "    cdi_kinds: nvidia.com/gpu",
        "    annotation_key_prefixes: none",
        f"  {FPGA}: its grants may hold, as drivers[sim].resource_policies[{FPGA}] declares:",
        "    envs: none",
        "    device_nodes: /dev/fpga* (char or block devices)",
        "    mounts: /opt/fpga/** (writable too)",
        "    cdi_kinds: none",
        "    annotation_key_prefixes: fpga.example.com/",
        "the static config serves example.com/a, example.com/b",
        "  example.com/a: its grants may hold, as resources[example.com/a].static.grant (policy unset) "
        "declares:",
        "    envs: A_DEVICES",
        "    device_nodes: /dev/a* (char devices)",
        "    mounts: none",
        "    cdi_kinds: none",
        "    annotation_key_prefixes: none",
        "  example.com/b: its grants may hold, as resources[example.com/b].policy declares:",
        "    envs: none",
        "    device_nodes: none",
        "    mounts: none",
        "    cdi_kinds: none",
        "    annotation_key_prefixes: none",
    ]


def test_floor_rules_a_policy_lifts_are_shown_in_capitals(tmp_path: Path) -> None:
    """A broad allowlist with two floor rules lifted: each lifted rule is its own UNSAFE line
    naming the setting and what it guards; a rule set to false lifts nothing and is not shown.
    Lifting is the operator's declared choice, not a likely mistake: --strict still passes."""
    policy = {
        "envs": ["*"],
        "device_nodes": ["/dev/**"],
        "device_node_types": None,
        "allow_world_writable_dirs": True,
        "unsafe": {"env.shell": True, "device.terminal": True, "env.loader": False},
    }
    driver = {
        "name": "sim",
        "command": [sys.executable],
        "user": "root",
        "resources": [SIM],
        "policy": policy,
    }
    result = check("--strict", write(tmp_path, {"drivers": [driver]}))
    assert (result.returncode, result.stderr) == (0, "")
    assert shown(result.stdout) == [
        f"driver sim may serve {SIM}",
        "  runs as root, as its user setting says",
        f"  {SIM}: its grants may hold, as drivers[sim].policy declares:",
        "    envs: *",
        "    device_nodes: /dev/** (any type, or nothing at all)",
        "    mounts: none",
        "    cdi_kinds: none",
        "    annotation_key_prefixes: none",
        "    host paths through world-writable directories: allowed (allow_world_writable_dirs)",
        "    UNSAFE: the floor's rule device.terminal is lifted (drivers[sim].policy.unsafe): its grants may "
        "hold the host's terminals and consoles (keystrokes into the host's sessions)",
        "    UNSAFE: the floor's rule env.shell is lifted (drivers[sim].policy.unsafe): its grants may hold "
        "what shells run or trace on start (SHELLOPTS=xtrace with PS4='$(cmd)' runs cmd)",
    ]


DRA_SETTINGS = {
    "drivers": [{"name": "sim", "command": ["devshim-sim"], "resources": ["example.com/gpu"]}],
    "dra": {
        "drivers": [{"name": "gpu.example.com", "resources": ["example.com/gpu"], "device_plugin": False}]
    },
}


def test_a_dra_config_outside_its_pod_is_checked_and_says_the_node_comes_from_the_pod(tmp_path: Path) -> None:
    """A rendered DRA config names no node (the pod's NODE_NAME does): checked as if it were, said
    so, rather than refused with 'dra.node_name is not set'; the summary covers DRA."""
    done = check_env(write(tmp_path, DRA_SETTINGS), env={})
    assert done.returncode == 0, done.stderr
    assert "DRA on node the pod's NODE_NAME (not set here: checked as if it were)" in done.stdout
    assert "  DRA driver gpu.example.com: example.com/gpu, served through DRA only" in done.stdout
    named = check_env(write(tmp_path, DRA_SETTINGS), env={"NODE_NAME": "node-7"})
    assert "DRA on node node-7;" in named.stdout
    # A bad node name from the environment is still the error it was.
    bad = check_env(write(tmp_path, DRA_SETTINGS), env={"NODE_NAME": "Not_A_Node"})
    assert bad.returncode == 2 and "Not_A_Node" in bad.stderr


def check_env(path: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "NODE_NAME" and not k.startswith("DEVSHIM_")}
    return subprocess.run(
        [*DEVSHIM, "check-config", path],
        capture_output=True,
        text=True,
        env=base | env,
        check=False,
        timeout=60,
    )

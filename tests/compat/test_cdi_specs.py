"""CDI specs a driver ships (protocol 1.2, issue 44 item 1): the names it grants resolve on the node.

devshim in-process, the sim as a real driver subprocess shipping a spec in ``initialize``, the
fake kubelet allocating. The spec is read back from the CDI folder as the container runtime
would read it (the JSON file, by CDI's rules: the kind, then a device of that name), not through
devshim's own code. A spec outside the driver's grant policy (a kind it did not declare, an env
name on the floor) fails the driver's start naming the rule, and nothing is written. And
`devshim compat` fails a granted CDI name that resolves in no spec, saying what to do.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.driverhost import DriverHost
from shim.settings import Settings
from tests.support import AS_ROOT
from tests.support.compat_cell import run_cell

GPU = "example.com/sim"
KIND = "example.com/simcdi"
SPEC_FILE = "devshim-driver-sim@example.com+simcdi.json"
WAIT_S = 20.0
AS_ROOT_FLAG = ("--driver-user", "root")


def settings(
    plugin_dir: Path, state_dir: Path, cdi_dir: Path | None, spec_env: str, policy: dict[str, Any]
) -> Settings:
    sim = {
        "resources": [
            {
                "name": GPU,
                "count": 2,
                "id_prefix": "gpu-",
                "grant": {"cdi_devices": [f"{KIND}={{id}}"]},
                "cdi_spec": {"kind": KIND, "edits": {"envs": {spec_env: "{ids}"}}},
            }
        ]
    }
    driver: dict[str, Any] = {
        "name": "sim",
        "command": [sys.executable, "-m", "devshim_adapters.sim", "--config-json", json.dumps(sim)],
        "resources": [GPU],
        "policy": policy,
        **AS_ROOT,
    }
    return Settings.load(
        device_plugins_dir=plugin_dir, state_dir=state_dir, cdi_dir=cdi_dir, drivers=[driver]
    )


def resolve(cdi_dir: Path, name: str) -> dict[str, Any]:
    """The container edits of CDI device ``name`` from the spec files in ``cdi_dir``, as a
    runtime finds them; AssertionError if none holds it."""
    kind, _, device = name.partition("=")
    for path in cdi_dir.glob("*.json"):
        spec = json.loads(path.read_text())
        if spec["kind"] == kind:
            for entry in spec["devices"]:
                if entry["name"] == device:
                    return dict(entry["containerEdits"])
    raise AssertionError(f"{name} resolves in no spec of {sorted(p.name for p in cdi_dir.iterdir())}")


async def failed_start(host: DriverHost) -> str:
    async with asyncio.timeout(WAIT_S):
        while host.start_failures == 0:
            await asyncio.sleep(0.02)
    return host.last_failure


async def test_a_shipped_spec_is_written_and_every_granted_name_resolves(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    other = {"cdiVersion": "0.3.0", "kind": "example.com/kept", "devices": []}
    (cdi_dir / "devshim-driver-sim@example.com+gone.json").write_text("{}")  # a kind shipped before
    (cdi_dir / "devshim-driver-other@example.com+kept.json").write_text(json.dumps(other))  # another's
    policy = {"cdi_kinds": [KIND], "envs": ["SIM_CDI"]}
    async with (
        FakeKubelet(plugin_dir) as kubelet,
        Shim(settings(plugin_dir, state_dir, cdi_dir, "SIM_CDI", policy)),
    ):
        session = await kubelet.wait_for_plugin(GPU, timeout=WAIT_S)
        await session.wait_for_list(lambda devices: len(devices) == 2, timeout=WAIT_S)
        written = json.loads((cdi_dir / SPEC_FILE).read_text())
        assert written["kind"] == KIND and written["cdiVersion"] == "0.3.0"
        chosen, grant = await session.admit(2)
        assert sorted(grant.cdi_devices) == sorted(f"{KIND}={d}" for d in chosen)
        for device_id in chosen:
            assert resolve(cdi_dir, f"{KIND}={device_id}") == {"env": [f"SIM_CDI={device_id}"]}
    assert sorted(p.name for p in cdi_dir.iterdir()) == [
        "devshim-driver-other@example.com+kept.json",
        SPEC_FILE,
    ]
    assert (cdi_dir / SPEC_FILE).stat().st_mode & 0o777 == 0o644


async def test_a_spec_of_an_undeclared_kind_fails_the_start_and_writes_nothing(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    cdi_dir = tmp_path / "cdi"
    policy = {"cdi_kinds": ["example.com/other"], "envs": ["SIM_CDI"]}
    async with Shim(settings(plugin_dir, state_dir, cdi_dir, "SIM_CDI", policy)) as shim:
        reason = await failed_start(shim.drivers[0])
    assert "cdi_kinds" in reason and KIND in reason and "drivers[sim].policy" in reason, reason
    assert not cdi_dir.exists() or not list(cdi_dir.iterdir())


async def test_a_spec_with_an_env_on_the_floor_fails_the_start_under_any_allowlist(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """CDI edits reach the container as a grant does: LD_PRELOAD stays refused under envs ["*"]."""
    cdi_dir = tmp_path / "cdi"
    policy = {"cdi_kinds": [KIND], "envs": ["*"]}
    async with Shim(settings(plugin_dir, state_dir, cdi_dir, "LD_PRELOAD", policy)) as shim:
        reason = await failed_start(shim.drivers[0])
    assert "env.loader" in reason and "LD_PRELOAD" in reason, reason
    assert not cdi_dir.exists() or not list(cdi_dir.iterdir())


async def test_a_spec_with_no_cdi_dir_configured_fails_the_start_naming_the_setting(
    plugin_dir: Path, state_dir: Path
) -> None:
    """Deny by default: without cdi_dir (a folder the pod mounts) a shipped spec is written nowhere."""
    policy = {"cdi_kinds": [KIND], "envs": ["SIM_CDI"]}
    async with Shim(settings(plugin_dir, state_dir, None, "SIM_CDI", policy)) as shim:
        reason = await failed_start(shim.drivers[0])
    assert "cdi_dir is not set" in reason and KIND in reason, reason


async def test_a_driver_taken_out_of_the_config_takes_its_specs_along_a_stop_does_not(
    plugin_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    """The runtime reads the specs while devshim is away: devshim stopping leaves them (its
    successor ships the same); a reload without the driver removes them, no other driver's."""
    cdi_dir = tmp_path / "cdi"
    policy = {"cdi_kinds": [KIND], "envs": ["SIM_CDI"]}
    configured = settings(plugin_dir, state_dir, cdi_dir, "SIM_CDI", policy)
    async with FakeKubelet(plugin_dir) as kubelet:
        async with Shim(configured):
            await (await kubelet.wait_for_plugin(GPU, timeout=WAIT_S)).wait_for_list(lambda d: len(d) == 2)
        assert (cdi_dir / SPEC_FILE).is_file()  # kept through a stop
        other = cdi_dir / "devshim-driver-other@example.com+kept.json"
        other.write_text("{}")
        async with Shim(configured) as shim:
            await (await kubelet.wait_for_plugin(GPU, timeout=WAIT_S)).wait_for_list(lambda d: len(d) == 2)
            await shim.reload(
                Settings.load(device_plugins_dir=plugin_dir, state_dir=state_dir, cdi_dir=cdi_dir)
            )
            assert sorted(p.name for p in cdi_dir.iterdir()) == [other.name]


# --- `devshim compat` resolves every CDI name a driver grants (the new driver author's case) -----


def fpga_driver(ships_spec: bool) -> list[str]:
    """The sim as a first driver's author wrote it from the docs: a grant naming its CDI device.
    Run as root (``--driver-user root``): the checkout may be readable by root alone."""
    resource: dict[str, Any] = {"name": "example.com/fpga", "count": 1, "id_prefix": "fpga-"}
    resource["grant"] = {"cdi_devices": ["example.com/fpga={id}"]}
    if ships_spec:
        resource["cdi_spec"] = {"kind": "example.com/fpga", "edits": {"envs": {"FPGA": "{ids}"}}}
    config = {"resources": [resource]}
    return [sys.executable, "-m", "devshim_adapters.sim", "--config-json", json.dumps(config)]


def test_compat_fails_a_granted_cdi_name_that_resolves_nowhere_saying_what_to_do(tmp_path: Path) -> None:
    cell = run_cell(
        tmp_path, "allocate", "--driver", shlex.join(fpga_driver(ships_spec=False)), *AS_ROOT_FLAG
    )
    assert (cell.code, cell.status) == (1, "fail")
    assert "the CDI device example.com/fpga=fpga-0 resolves in no CDI spec" in cell.reason, cell.reason
    assert "cdi_specs" in cell.reason and "--cdi-dir" in cell.reason and "\n" not in cell.reason


def test_compat_passes_a_cdi_name_the_driver_ships_or_the_node_holds(tmp_path: Path) -> None:
    shipped = run_cell(
        tmp_path, "allocate", "--driver", shlex.join(fpga_driver(ships_spec=True)), *AS_ROOT_FLAG
    )
    assert (shipped.code, shipped.status) == (0, "pass"), shipped.reason
    node = tmp_path / "etc-cdi"
    node.mkdir()
    # As a vendor's image installs it, in YAML.
    (node / "vendor.yaml").write_text(
        "cdiVersion: 0.3.0\nkind: example.com/fpga\ndevices:\n- {name: fpga-0, containerEdits: {env: [A=1]}}"
    )
    installed = run_cell(
        tmp_path,
        "allocate",
        "--driver",
        shlex.join(fpga_driver(ships_spec=False)),
        "--cdi-dir",
        str(node),
        *AS_ROOT_FLAG,
    )
    assert (installed.code, installed.status) == (0, "pass"), installed.reason

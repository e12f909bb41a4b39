"""The `devshim run` commands README.md and docs/configuration.md show, run as a newcomer would
copy them: from the repository root, against the fake kubelet (only the directories moved to
scratch ones, since /var/lib/kubelet is not ours here, and each driver run as root, since this
checkout's interpreter may be root's alone, where a driver's default user cannot run it)."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import sys
from pathlib import Path

import pytest
import yaml

from shim.compat.fakekubelet import FakeKubelet
from tests.support import ROOT
from tests.support.devshim_process import DEVSHIM


def documented_runs(doc: str) -> list[str]:
    """Each `devshim run ...` command in the ```sh blocks of ``doc``, continuation lines joined."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / doc).read_text(), re.S)
    commands = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in commands if line.startswith("devshim run ")]


DOCUMENTED = [
    (doc, command) for doc in ("README.md", "docs/configuration.md") for command in documented_runs(doc)
]


def test_the_docs_show_how_to_give_a_driver_its_environment() -> None:
    """A `--driver` started from the command line has an empty environment unless given one: the
    configuration reference shows how in a command (which the test below runs), and the README,
    whose quick start keeps to what a driver serves and grants, says it next to that command."""
    assert any("--driver-env" in command for d, command in DOCUMENTED if d == "docs/configuration.md")
    assert re.search(r"`--driver-env \w+=\w+`", (ROOT / "README.md").read_text())


def test_the_documented_driver_commands_declare_what_the_driver_serves_and_grants() -> None:
    """A `--driver` without `--driver-resource` is refused at start: every documented one has it,
    and, since grants are denied unless declared, says what its grants may hold."""
    drivers = [(doc, command) for doc, command in DOCUMENTED if "--driver " in command]
    assert {doc for doc, _ in drivers} == {"README.md", "docs/configuration.md"}
    for doc, command in drivers:
        assert "--driver-resource " in command and "--driver-allow " in command, (doc, command)


def as_root(config: Path, folder: Path) -> Path:
    """A copy of ``config`` whose drivers run as root."""
    settings = yaml.safe_load(config.read_text())
    for driver in settings.get("drivers", []):
        driver["user"] = "root"
    copy = folder / config.name
    copy.write_text(yaml.safe_dump(settings))
    return copy


@pytest.mark.parametrize(
    ("doc", "command"), DOCUMENTED, ids=[f"{doc}-{n}" for n, (doc, _) in enumerate(DOCUMENTED)]
)
async def test_a_documented_run_command_serves_its_devices(
    doc: str, command: str, plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """Each command starts, registers its resources with the kubelet and lists their devices,
    and stops cleanly on SIGINT (Ctrl-C)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if "devshim-sim" in command and shutil.which("devshim-sim", path=env["PATH"]) is None:
        pytest.skip("devshim-sim is not installed in this environment")
    argv = shlex.split(command, comments=True)
    argv += [f"--driver-user={name}=root" for name in re.findall(r"--driver (\w[-\w.]*)=", command)]
    if "--config" in argv:
        argv[argv.index("--config") + 1] = str(as_root(ROOT / argv[argv.index("--config") + 1], tmp_path))
    proc = await asyncio.create_subprocess_exec(
        *DEVSHIM, *argv[1:], "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir),
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await kubelet.wait_until(
            lambda: any(r.ok for r in kubelet.registrations), timeout=30, what="a resource"
        )
        first = next(r for r in kubelet.registrations if r.ok)
        session = await kubelet.wait_for_plugin(first.resource_name, timeout=30)
        assert await session.wait_for_list(lambda devices: len(devices) > 0)
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(15):
            _, stderr = await proc.communicate()
        assert proc.returncode == 0, stderr.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()

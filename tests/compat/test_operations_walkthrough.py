"""docs/operations.md's "Try it on one machine first", as a new user would type it: the config it
shows, check-config, devshim run, the fake kubelet from the command line, status and metrics."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shim.compat.realnode.node import free_port
from tests.support.devshim_process import DEVSHIM, http_get

DOC = Path(__file__).parents[2] / "docs" / "operations.md"


def documented_config() -> str:
    section = DOC.read_text().split("## Try it on one machine first", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"cat > /tmp/devshim.yaml <<'EOF'\n(.*?)\nEOF\n", section, re.S)
    assert match, "the walkthrough's config is gone from docs/operations.md"
    return match.group(1)


async def test_the_walkthrough_in_docs_operations_md_works(
    tmp_path: Path, plugin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "devshim.yaml"
    text = (
        documented_config()
        .replace("/tmp/dp", str(plugin_dir))
        .replace("/tmp/devshim-state", str(tmp_path / "s"))
    )
    # The driver as root: this checkout's interpreter may be root's alone, where the default
    # user, nobody, cannot run it (the walkthrough says so).
    settings = yaml.safe_load(text)
    for driver in settings["drivers"]:
        driver["user"] = "root"
    config.write_text(yaml.safe_dump(settings))
    port = free_port()
    monkeypatch.setenv("DEVSHIM_HTTP__PORT", str(port))

    checked = subprocess.run(
        [*DEVSHIM, "check-config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0 and "valid; serves driver sim" in checked.stdout, checked.stderr
    pipe = asyncio.subprocess.PIPE
    shim = await asyncio.create_subprocess_exec(
        *DEVSHIM, "run", "--config", str(config), stdout=pipe, stderr=pipe
    )
    kubelet = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "shim.compat.fakekubelet.serve", str(plugin_dir), stdout=pipe, stderr=pipe
    )
    try:
        assert kubelet.stdout is not None
        seen: list[str] = []
        while not any("4 devices" in line for line in seen):
            async with asyncio.timeout(30):
                raw_line = await kubelet.stdout.readline()
            seen.append(raw_line.decode())
        assert any("example.com/sim: registered (v1beta1" in line for line in seen), seen
        status = await asyncio.to_thread(
            subprocess.run, [*DEVSHIM, "status"], capture_output=True, text=True, timeout=30
        )
        assert (
            "example.com/sim: registered as v1beta1, 1 registration; 4 Healthy, 0 Unhealthy" in status.stdout
        )
        assert "driver sim: up" in status.stdout
        code, metrics = await asyncio.to_thread(http_get, f"http://localhost:{port}/metrics")
        assert code == 200
        assert 'devshim_devices{health="Healthy",resource="example.com/sim"} 4.0' in metrics
        assert "_created" not in metrics
    finally:
        for proc in (shim, kubelet):
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
                try:
                    async with asyncio.timeout(15):
                        await proc.communicate()
                except TimeoutError:
                    proc.kill()
                    await proc.communicate()
    assert shim.returncode == 0

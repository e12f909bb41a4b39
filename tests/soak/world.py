"""The soak's world: a real `devshim run` process, real driver processes, the fake kubelet.

Everything lives in one temporary directory under /tmp (unix socket paths must stay under 107
bytes). devshim runs as a subprocess from a config file, so it can be SIGKILLed and started again
on the same state_dir; its drivers are the simulated driver (adapters/sim) as real processes. The
fake kubelet and its PodResources service (kubelet.py) run in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shim.compat.fakekubelet import PluginSession
from shim.compat.modes import KUBELET_LINE, Kubelet
from shim.compat.realnode.node import free_port

from . import hostile_driver
from .kubelet import PodResources, RecordingKubelet

ROOT = Path(__file__).resolve().parents[2]  # devshim's checkout: `python -m shim` runs from here

# The kubelet's deadline for Allocate in the soak. devshim must answer well within it: its worst
# case is restart.call_wait_s (a restarting driver) plus timeouts.allocate_s (a hung one).
KUBELET_DEADLINE_S = 5.0
ALLOCATE_TIMEOUT_S = 0.5
CALL_WAIT_S = 1.5


@dataclass(frozen=True)
class Served:
    """A resource devshim serves in the soak, and the driver behind it (None: static)."""

    name: str
    driver: str | None
    devices: frozenset[str]


SERVED = (
    Served("example.com/soak-a", "soak-a", frozenset(f"a-{i}" for i in range(4))),
    Served("example.com/soak-b", "soak-b", frozenset(f"b-{i}" for i in range(4))),
    Served("example.com/soak-static", None, frozenset({"s0", "s1"})),
    # The hostile driver (hostile_driver.py), attacking when the hostile_attack fault says.
    Served(hostile_driver.RESOURCE, "soak-hostile", frozenset(hostile_driver.DEVICES)),
)
HOSTILE = "soak-hostile"
# The env names each resource's grants may hold: what its policy declares.
ALLOWED_ENVS = {
    s.name: ({"HOSTILE"} if s.driver == HOSTILE else {"SOAK"} if s.driver else set()) for s in SERVED
}


def _driver(served: Served, root: Path) -> dict[str, Any]:
    assert served.driver is not None
    declared = {"resources": [served.name], "policy": {"envs": sorted(ALLOWED_ENVS[served.name])}}
    if served.driver == HOSTILE:
        command = [sys.executable, str(Path(hostile_driver.__file__))]
        env = {"HOSTILE_ATTACK_FILE": str(root / "hostile-attack")}
        return {"name": served.driver, "user": "root", "command": command, "env": env, **declared, **_TUNED}
    sim = {
        "resources": [
            {
                "name": served.name,
                "devices": [{"id": d} for d in sorted(served.devices)],
                "grant": {"envs": {"SOAK": "{ids}"}},
                # The kubelet's Deallocate (v1beta2) or devshim's PodResources emulation (v1beta1)
                # reaches the driver, so PodResources faults have something to disturb.
                "deallocate": True,
            }
        ]
    }
    command = [sys.executable, "-m", "devshim_adapters.sim", "--config-json", json.dumps(sim)]
    return {"name": served.driver, "user": "root", "command": command, **declared, **_TUNED}


_TUNED: dict[str, Any] = {
    # Short deadlines so a hung (SIGSTOPped) driver is found by the next call within 0.5 s.
    "timeouts": {
        "initialize_s": 5,
        "list_devices_s": 2,
        "allocate_s": ALLOCATE_TIMEOUT_S,
        "deallocate_s": ALLOCATE_TIMEOUT_S,
        "shutdown_s": 1,
    },
    # Tuned, not defaults: the defaults (30 s stable_after_s, 30 s backoff cap) are right for a
    # node, where a driver crashing again within 30 s is a crash loop; the soak kills drivers
    # every second or two by design, and the 2 s recovery promise is about devshim's reaction,
    # not about how patient a crash-loop backoff is.
    "restart": {
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.4,
        "stable_after_s": 1.0,
        "call_wait_s": CALL_WAIT_S,
        "max_start_failures": 20,
    },
}


def devshim_config(root: Path) -> dict[str, Any]:
    return {
        "device_plugins_dir": str(root / "dp"),
        "state_dir": str(root / "state"),
        "api_versions": ["v1beta1", "v1beta2"],
        "register_backoff_max_s": 0.2,
        "log_level": "INFO",
        "deallocation": {
            "pod_resources_socket": str(root / "pr" / "kubelet.sock"),
            # Fast polling: its 16x slowdown while rate-limited or unavailable stays under 1 s.
            "poll_interval_s": 0.05,
            "grace_s": 0.3,
        },
        "drivers": [_driver(s, root) for s in SERVED if s.driver],
        "resources": [
            {"name": s.name, "static": {"devices": [{"id": d} for d in sorted(s.devices)]}}
            for s in SERVED
            if s.driver is None
        ],
    }


class Devshim:
    """`devshim run` as a subprocess: started, SIGKILLed, started again on the same state_dir."""

    def __init__(self, config: Path, log: Path) -> None:
        self.config = config
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.starts = 0

    async def start(self) -> float:
        """Spawn a new devshim; time.monotonic() at the spawn."""
        self.port = free_port()
        env = {**os.environ, "DEVSHIM_HTTP__PORT": str(self.port), "DEVSHIM_HTTP__HOST": "127.0.0.1"}
        with self.log.open("ab") as stderr:
            spawned = time.monotonic()
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "shim", "run", "--config", str(self.config),
                env=env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip
        self.starts += 1
        return spawned

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def stop(self) -> int | None:
        """SIGTERM (a clean exit is 0), SIGKILL after 10 s; the exit status."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return self.proc.returncode

    async def status(self, timeout: float = 1.0) -> dict[str, Any] | None:
        """devshim's /status document; None while it does not answer (not up yet, or dead)."""
        if self.proc is None or self.proc.returncode is not None:
            return None
        try:
            async with asyncio.timeout(timeout):
                return await self._get("/status")
        except (OSError, TimeoutError, ValueError):
            return None

    async def _get(self, path: str) -> dict[str, Any]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: soak\r\n\r\n".encode())
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        head, _, body = raw.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n")[0]:
            raise ValueError(f"GET {path}: {head[:80]!r}")
        document: dict[str, Any] = json.loads(body)
        return document


@dataclass
class World:
    root: Path
    kubelet: RecordingKubelet
    pod_resources: PodResources
    devshim: Devshim
    kubelet_now: Kubelet = KUBELET_LINE[1]
    sessions: list[PluginSession] = field(default_factory=list)

    @property
    def plugin_dir(self) -> Path:
        return self.kubelet.plugin_dir

    def session(self, resource: str) -> PluginSession | None:
        """The kubelet's current session of `resource`, None when it has none."""
        try:
            return self.kubelet.plugin(resource)
        except KeyError:
            return None

    async def restart_kubelet(self, kubelet: Kubelet, down_s: float) -> None:
        """The kubelet process restarts as `kubelet`: it stops (streams end, PodResources goes),
        `down_s` later the new one cleans device-plugins/ as its profile does and serves again.

        FakeKubelet.restart() alone stops and cleans in the same instant; a real kubelet takes a
        second or more to start, so a plugin has re-served its socket well before the cleanup.
        """
        await self.pod_resources.stop()
        await self.kubelet.stop()
        await asyncio.sleep(down_s)
        await self.kubelet.restart(profile=kubelet.profile, versions=kubelet.versions)  # stops nothing now
        self.kubelet_now = kubelet
        await self.pod_resources.start()


@contextlib.asynccontextmanager
async def world(keep: bool = False) -> AsyncIterator[World]:
    """A started world: devshim spawned (not yet waited for), the kubelet and PodResources up."""
    root = Path(tempfile.mkdtemp(prefix="ds-soak-", dir="/tmp"))
    config = root / "devshim.yaml"
    config.write_text(yaml.safe_dump(devshim_config(root)))
    (root / "pr").mkdir()
    sessions: list[PluginSession] = []
    # 1.25-1.32 speaking v1beta1: the kubelet most nodes run, with the late-stream race (#121994),
    # and one step from either end of the line, so upgrades and downgrades both apply at once.
    first = KUBELET_LINE[1]
    kubelet = RecordingKubelet(
        root / "dp",
        rpc_timeout_s=KUBELET_DEADLINE_S,
        versions=first.versions,
        profile=first.profile,
        on_session=sessions.append,
    )
    pod_resources = PodResources(root / "pr" / "kubelet.sock", kubelet, [s.name for s in SERVED])
    devshim = Devshim(config, root / "devshim.log")
    the_world = World(root, kubelet, pod_resources, devshim, first, sessions)
    try:
        async with kubelet:
            await pod_resources.start()
            try:
                await devshim.start()
                yield the_world
            finally:
                await devshim.stop()
                await pod_resources.stop()
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)

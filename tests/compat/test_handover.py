"""devshim's own upgrade: a second devshim process takes the node's resources over from the first
(a DaemonSet rolling update), against kubelets with and without the late-stream race (#121994)."""

from __future__ import annotations

import asyncio
import functools
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest

from shim.compat.fakekubelet import FakeKubelet
from tests.support import DRIVERS
from tests.support.devshim_process import start_devshim

LIFECYCLE = str(DRIVERS / "lifecycle.py")
EXPECTED = {"example.com/foo": 3, "example.com/life": 4}  # a static resource and a driver's


def has_count(count: int, devices: tuple[object, ...]) -> bool:
    return len(devices) == count


def args(plugin_dir: Path, state_dir: Path) -> list[str]:
    return [
        *("run", "--device-plugins-dir", str(plugin_dir), "--state-dir", str(state_dir)),
        *(
            "-r",
            "example.com/foo=3",
            "--driver",
            f"life={sys.executable} {LIFECYCLE}",
            "--driver-user",
            "life=root",
        ),
        *("--driver-resource", "life=example.com/life"),
    ]


@pytest.mark.parametrize(
    ("profile", "registration"),
    [("1.25-1.32", "classic"), ("1.33+", "classic"), ("next", "classic"), ("1.33+", "watcher")],
)
async def test_a_new_devshim_takes_over_without_a_list_ever_lacking_a_device(
    plugin_dir: Path, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str,
    registration: str,
) -> None:  # fmt: skip
    """The new instance asks the old one to let go, the old one closes its streams, only then does
    the new one register; the old one exits on SIGTERM without touching the new one's sockets. The
    kubelet ends with a live registration of the new instance, and no list it received (before,
    during or after) lacks a device."""
    procs: list[asyncio.subprocess.Process] = []
    registry = None
    if registration == "watcher":
        registry = Path(tempfile.mkdtemp(prefix="ds-reg-", dir="/tmp"))  # short: socket paths
        monkeypatch.setenv("DEVSHIM_REGISTRATION", "watcher")
        monkeypatch.setenv("DEVSHIM_PLUGINS_REGISTRY_DIR", str(registry))
    socket_dir = registry or plugin_dir
    async with FakeKubelet(plugin_dir, profile=profile, plugins_registry=registry) as kubelet:
        try:
            procs.append(old := await start_devshim(*args(plugin_dir, state_dir)))
            old_sessions = {r: await kubelet.wait_for_plugin(r, timeout=30) for r in EXPECTED}
            for resource, count in EXPECTED.items():
                await old_sessions[resource].wait_for_list(functools.partial(has_count, count))

            procs.append(await start_devshim(*args(plugin_dir, state_dir)))
            for resource in EXPECTED:
                await kubelet.wait_for_registration(resource, count=2, timeout=30)
            new_sessions = {r: kubelet.plugin(r) for r in EXPECTED}
            for resource, session in new_sessions.items():
                assert session.endpoint != old_sessions[resource].endpoint
                # The old stream had ended before the new registration (else it is torn down).
                assert old_sessions[resource].stream_ended.is_set()

            old.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20):
                _, old_err = await old.communicate()
            assert old.returncode == 0, old_err.decode()
            await asyncio.sleep(1.0)  # time for a late teardown to show
            for resource, count in EXPECTED.items():
                session = kubelet.plugin(resource)
                assert session is new_sessions[resource] and not session.stream_ended.is_set(), session
                assert (socket_dir / Path(session.endpoint).name).exists()
                for listed in [*old_sessions[resource].lists, *session.lists]:
                    assert len(listed) == count, (resource, listed)
            assert (await kubelet.plugin("example.com/foo").allocate(["dev0"])) is not None
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.communicate()
            if registry is not None:
                shutil.rmtree(registry, ignore_errors=True)


async def test_an_instance_that_handed_over_serves_again_when_its_successor_dies(
    plugin_dir: Path, state_dir: Path
) -> None:
    """A second devshim takes over, then is SIGKILLed (a crash, a bad rollout): the first notices
    its successor is gone and registers every resource again, and Allocate works through it
    (before: it never served again, /readyz 503 forever, its driver still running)."""
    async with FakeKubelet(plugin_dir) as kubelet:
        procs: list[asyncio.subprocess.Process] = []
        try:
            procs.append(old := await start_devshim(*args(plugin_dir, state_dir)))
            for resource in EXPECTED:
                await kubelet.wait_for_plugin(resource, timeout=30)
            procs.append(new := await start_devshim(*args(plugin_dir, state_dir)))
            for resource in EXPECTED:
                await kubelet.wait_for_registration(resource, count=2, timeout=30)
            taken = {r: kubelet.plugin(r).endpoint for r in EXPECTED}
            new.kill()
            await new.communicate()
            for resource, count in EXPECTED.items():
                await kubelet.wait_for_registration(resource, count=3, timeout=30)
                session = kubelet.plugin(resource)
                assert session.endpoint != taken[resource]  # the old instance's socket again
                await session.wait_for_list(functools.partial(has_count, count))
            assert (await kubelet.plugin("example.com/foo").allocate(["dev0"])) is not None
            assert old.returncode is None
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.communicate()


async def test_an_instance_that_handed_over_serves_again_when_its_successor_hangs(
    plugin_dir: Path, state_dir: Path
) -> None:
    """A second devshim takes over, then is stopped (SIGSTOP: hung, its sockets still accepting
    connections, which the kernel queues). It answers no health check, so the first registers
    every resource again within a bound and Allocate works through it (before: a connect was
    taken for alive, and the first never served again)."""
    async with FakeKubelet(plugin_dir) as kubelet:
        procs: list[asyncio.subprocess.Process] = []
        new = None
        try:
            procs.append(old := await start_devshim(*args(plugin_dir, state_dir)))
            for resource in EXPECTED:
                await kubelet.wait_for_plugin(resource, timeout=30)
            procs.append(new := await start_devshim(*args(plugin_dir, state_dir)))
            for resource in EXPECTED:
                await kubelet.wait_for_registration(resource, count=2, timeout=30)
            taken = {r: kubelet.plugin(r).endpoint for r in EXPECTED}
            new.send_signal(signal.SIGSTOP)
            for resource, count in EXPECTED.items():
                # Three looks of ANSWER_S and the registration: well under this on a busy machine.
                await kubelet.wait_for_registration(resource, count=3, timeout=45)
                session = kubelet.plugin(resource)
                assert session.endpoint != taken[resource]  # the old instance's socket again
                await session.wait_for_list(functools.partial(has_count, count))
            assert (await kubelet.plugin("example.com/foo").allocate(["dev0"])) is not None
            assert old.returncode is None
        finally:
            if new is not None and new.returncode is None:
                new.send_signal(signal.SIGCONT)  # a stopped process takes SIGKILL, but let it go on
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.communicate()

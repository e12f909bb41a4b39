"""Attacks on the legacy adapter by whoever can write its --kubelet-dir (issue 19, items 2 and 3).

In the sidecar form that directory is an emptyDir the vendor's untrusted container writes to,
while the adapter runs as root. Each attack is a real process working on real files and unix
sockets, against the adapter's own kubelet side (PrivateKubelet) in this process or against the
whole adapter behind devshim. Registrations come from tests/support/legacy_plugins/python/register.py, a
client sharing no code with devshim.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from adapters.legacy.kubelet import LegacyPlugin, PrivateKubelet
from shim.compat.fakekubelet import records
from tests.support.legacy import PYTHON_PLUGIN, RESOURCE, plugin_env, served

ATTACKER = "example.com/evil"
RACE_ROUNDS = 30

# Replaces kubelet.sock with a symlink to TARGET as fast as it can, printing the mode of every
# socket it finds there first (each distinct mode once).
RACER = r"""
import os, stat, sys
sock, target, swap = sys.argv[1:4]
seen = set()
print("racing", flush=True)
while True:
    try:
        st = os.lstat(sock)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) not in seen:
        seen.add(stat.S_IMODE(st.st_mode))
        print(oct(stat.S_IMODE(st.st_mode)), flush=True)
    try:
        os.symlink(target, swap)
    except FileExistsError:
        pass
    os.rename(swap, sock)
"""


class Followed:
    """What the adapter's kubelet side reports of the legacy plugins it follows."""

    def __init__(self) -> None:
        self.lists: dict[str, tuple[records.DeviceState, ...]] = {}
        self.listed = asyncio.Event()

    async def on_list(self, plugin: LegacyPlugin, devices: tuple[records.DeviceState, ...]) -> None:
        self.lists[plugin.resource] = devices
        self.listed.set()

    async def on_gone(self, plugin: LegacyPlugin) -> None:
        pass

    async def wait_for(self, resource: str) -> tuple[records.DeviceState, ...]:
        while resource not in self.lists:
            self.listed.clear()
            await self.listed.wait()
        return self.lists[resource]


@asynccontextmanager
async def private_kubelet(directory: Path, **options: Any) -> AsyncIterator[tuple[PrivateKubelet, Followed]]:
    followed = Followed()
    kubelet = PrivateKubelet(directory, followed.on_list, followed.on_gone, **options)
    await kubelet.start()
    try:
        yield kubelet, followed
    finally:
        await kubelet.stop()


async def register(
    stubs: Path, kubelet_socket: Path, registrations: list[tuple[str, str]]
) -> list[str | None]:
    """Each registration's error details (None: accepted), from a separate client process."""
    client = await asyncio.create_subprocess_exec(
        sys.executable, str(PYTHON_PLUGIN / "register.py"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env={"PYTHONPATH": str(stubs)},
    )  # fmt: skip
    job = json.dumps({"socket": str(kubelet_socket), "registrations": registrations})
    async with asyncio.timeout(60):
        out, _ = await client.communicate(job.encode())
    assert client.returncode == 0
    results: list[str | None] = json.loads(out)
    return results


@contextmanager
def victim_socket(path: Path) -> Iterator[socket.socket]:
    """A root-only socket outside the kubelet dir, standing for any privileged service's."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        path.chmod(0o600)
        listener.listen(8)
        listener.setblocking(False)
        yield listener
    finally:
        listener.close()


def was_dialled(listener: socket.socket) -> bool:
    try:
        connection, _ = listener.accept()
    except BlockingIOError:
        return False
    connection.close()
    return True


@pytest.fixture
def attack_dir(private_dir: Path) -> Path:
    """A root-only directory holding the kubelet dir ``k`` (the attacker's) and the victims."""
    private_dir.chmod(0o700)
    (private_dir / "k").mkdir(mode=0o777)
    return private_dir


# --- item 2: kubelet.sock's mode --------------------------------------------------------------


async def test_kubelet_sock_never_has_another_mode_and_no_symlink_is_followed(attack_dir: Path) -> None:
    """A process races to replace kubelet.sock with a symlink to a root-only file while the
    adapter starts and stops, again and again: the file keeps its mode (the adapter used to chmod
    through the link), and every socket ever seen at kubelet.sock already has the configured mode."""
    kdir = attack_dir / "k"
    secret = attack_dir / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    sock = kdir / "kubelet.sock"
    racer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        RACER,
        str(sock),
        str(secret),
        str(kdir / ".swap"),
        stdout=asyncio.subprocess.PIPE,
    )
    assert racer.stdout is not None
    try:
        async with asyncio.timeout(30):
            ready = await racer.stdout.readline()
        assert ready == b"racing\n"
        for _ in range(RACE_ROUNDS):
            async with private_kubelet(kdir, socket_mode=0o666):
                pass
            assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    finally:
        racer.terminate()
        out, _ = await racer.communicate()
    assert set(out.decode().split()) <= {"0o666"}
    (kdir / ".swap").unlink(missing_ok=True)

    async with private_kubelet(kdir, socket_mode=0o666):
        st = os.lstat(sock)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
        # Swapped before stop: stop removes its own socket only, and follows nothing.
        (kdir / ".swap").symlink_to(secret)
        os.rename(kdir / ".swap", sock)
    assert sock.is_symlink() and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_text() == "root only\n"
    assert sorted(os.listdir(kdir)) == ["kubelet.sock"]  # no private bind directory left behind


# --- item 3: the registered endpoint -----------------------------------------------------------


async def test_register_refuses_an_endpoint_that_is_not_a_plain_socket_in_the_directory(
    attack_dir: Path, stubs: Path, warnings: list[str]
) -> None:
    """Endpoints escaping the kubelet dir or naming anything but a socket of its own there are
    refused at Register, as the kubelet refuses (an error to the caller), logged, never dialled."""
    kdir = attack_dir / "k"
    secret = attack_dir / "x.sock"
    with victim_socket(secret) as victim:
        (kdir / "sub").symlink_to(attack_dir)
        (kdir / "link.sock").symlink_to(secret)
        (kdir / "file.sock").write_text("")
        (kdir / "dir.sock").mkdir()
        os.link(secret, kdir / "hard.sock")
        endpoints = [
            "../x.sock", str(secret), "sub/x.sock", "link.sock", "file.sock", "dir.sock", "hard.sock",
            "", ".", "..", "kubelet.sock", "nul\0.sock", "x" * 256,
        ]  # fmt: skip
        async with private_kubelet(kdir) as (kubelet, _):
            results = await register(stubs, kdir / "kubelet.sock", [(ATTACKER, e) for e in endpoints])
            refused = dict(zip(endpoints, results, strict=True))
            assert all(r is not None and r.startswith("UNKNOWN: ") for r in results), refused
            assert kubelet.plugins == {}
            assert not was_dialled(victim)
    for result in results:
        assert result is not None
        assert any(result.removeprefix("UNKNOWN: ") in w for w in warnings), (result, warnings)


@pytest.mark.parametrize("swap", ["symlink", "hardlink", "file"])
async def test_an_endpoint_swapped_in_after_register_is_never_dialled(
    attack_dir: Path, stubs: Path, warnings: list[str], swap: str
) -> None:
    """Register names a socket that does not exist yet (accepted: plugins that register before
    they serve are common); then a symlink or hard link to a root-only socket, or a plain file,
    appears under that name. The adapter refuses it when dialling, at once, and never connects."""
    kdir = attack_dir / "k"
    secret = attack_dir / "x.sock"
    late = kdir / "late.sock"
    with victim_socket(secret) as victim:
        async with private_kubelet(kdir) as (kubelet, _):
            assert await register(stubs, kdir / "kubelet.sock", [(ATTACKER, late.name)]) == [None]
            if swap == "symlink":
                late.symlink_to(secret)
            elif swap == "hardlink":
                os.link(secret, late)
            else:
                late.write_text("")
            follower = kubelet.plugins[ATTACKER].task
            assert follower is not None
            loop = asyncio.get_running_loop()
            accepting = asyncio.ensure_future(loop.sock_accept(victim))
            done, _ = await asyncio.wait({accepting, follower}, timeout=10, return_when="FIRST_COMPLETED")
            accepting.cancel()
            assert accepting not in done and follower in done
    assert any("late.sock" in w for w in warnings), warnings


async def test_a_legitimate_plugin_is_served_and_unlisted_resources_are_refused(
    attack_dir: Path, stubs: Path, warnings: list[str]
) -> None:
    """With an allow-list, a resource name outside it is refused at Register even on a good
    socket, while the listed legacy plugin (a real process) registers and is followed."""
    kdir = attack_dir / "k"
    async with private_kubelet(kdir, allowed_resources=[RESOURCE]) as (kubelet, followed):
        plugin = await asyncio.create_subprocess_exec(
            sys.executable, str(PYTHON_PLUGIN / "plugin.py"), env=plugin_env(kdir, stubs)
        )
        try:
            async with asyncio.timeout(30):
                devices = await followed.wait_for(RESOURCE)
            assert [d.id for d in devices] == ["p0", "p1", "p2"]
            grants = await kubelet.plugins[RESOURCE].client.allocate([["p1"]], 10)
            assert grants[0].envs == {"PYPLUG": "p1"}
            [refused] = await register(stubs, kdir / "kubelet.sock", [(ATTACKER, "pyplug.sock")])
            assert refused is not None and ATTACKER in refused
            assert set(kubelet.plugins) == {RESOURCE}
        finally:
            plugin.terminate()
            await plugin.wait()
    assert any(ATTACKER in w for w in warnings), warnings


async def test_the_adapter_refuses_foreign_registrations_end_to_end(
    plugin_dir: Path, state_dir: Path, private_dir: Path, stubs: Path
) -> None:
    """The whole adapter behind devshim, started with --resource: its plugin is served, while
    another resource name, or an endpoint outside the directory, is refused at Register."""
    command = [sys.executable, str(PYTHON_PLUGIN / "plugin.py")]
    env = plugin_env(private_dir, stubs)
    async with served(
        plugin_dir, state_dir, private_dir, command, env, adapter_args=["--resource", RESOURCE]
    ) as (session, _):
        results = await register(
            stubs, private_dir / "kubelet.sock", [(ATTACKER, "pyplug.sock"), (RESOURCE, "../pyplug.sock")]
        )
        assert all(r is not None and r.startswith("UNKNOWN: ") for r in results), results
        assert (await session.allocate(["p0"])).envs == {"PYPLUG": "p0"}

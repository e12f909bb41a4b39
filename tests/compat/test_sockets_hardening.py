"""Plugin sockets are never reachable with looser permissions than configured, not even briefly.

devshim binds each socket in a private 0700 directory beside its final path, gives it its mode
and group there, and renames it into place (shim/node/sockets.py). These tests watch a real
devshim start against the fake kubelet: with inotify, the final name must only ever appear by
rename (never be created or chmod-ed in place), and a separate process stat()ing the final
path in a tight loop must only ever see the configured mode and group.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from asyncinotify import Inotify, Mask

from shim.bootstrap import Shim
from shim.compat.fakekubelet import CleanupMode, FakeKubelet
from shim.node.sockets import BIND_DIR_PREFIX, BIND_NAME
from shim.settings import MAX_SOCKET_PATH, PRIVATE_BIND_EXTRA
from tests.support.privileges import NOBODY, NOBODY_PYTHON, NOGROUP, can_drop_capabilities, needs_nobody
from tests.support.shim_fixtures import FOO, settings_for

SOCKET = "hard.sock"
KUBELETS_FILES = ("kubelet.sock", "DEPRECATION")
WAIT_S = 20.0

# Records every distinct (mode, gid) seen at PATH until stdin closes, then prints them as JSON.
STAT_LOOP = r"""
import json, os, sys, threading
path, seen, done = sys.argv[1], set(), threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        continue
    seen.add((st.st_mode, st.st_gid))
print(json.dumps(sorted(seen)))
"""


@asynccontextmanager
async def devshim(plugin_dir: Path, **extra: Any) -> AsyncIterator[tuple[FakeKubelet, Shim]]:
    settings = settings_for(plugin_dir, {FOO: {"count": 2}}, **extra)
    settings = settings.model_copy(
        update={"resources": [settings.resources[0].model_copy(update={"socket_name": SOCKET})]}
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings) as shim:
        yield kubelet, shim


def bind_dirs(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(BIND_DIR_PREFIX))


@pytest.mark.parametrize(
    ("socket_settings", "mode", "gid"),
    [
        pytest.param({}, 0o600, os.getgid(), id="default"),
        pytest.param({"mode": "0660", "group": "nogroup"}, 0o660, NOGROUP, id="group-0660"),
    ],
)
async def test_the_socket_appears_only_by_rename_with_its_final_mode_and_group(
    plugin_dir: Path, socket_settings: dict[str, Any], mode: int, gid: int
) -> None:
    """Watching the start-up: the final name is never created or changed in place, only renamed
    into (inotify); every stat of it shows the configured mode and group; the private directory
    is gone afterwards, and the kubelet registered and can use the plugin."""
    if gid != os.getgid() and os.geteuid() != 0:
        pytest.skip("giving the socket another group needs root")
    final = plugin_dir / SOCKET
    watcher = subprocess.Popen(
        [sys.executable, "-c", STAT_LOOP, str(final)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    events: list[tuple[Mask, str]] = []
    with Inotify() as inotify:
        inotify.add_watch(plugin_dir, Mask.CREATE | Mask.MOVED_TO | Mask.ATTRIB | Mask.DELETE)

        async def record() -> None:
            async for event in inotify:
                events.append((event.mask, event.name.name if event.name else ""))

        recorder = asyncio.create_task(record())
        try:
            async with devshim(plugin_dir, socket=socket_settings) as (kubelet, _):
                session = await kubelet.wait_for_plugin(FOO, timeout=WAIT_S)
                assert len(await session.wait_for_list()) == 2
                assert (await session.allocate(["dev0"])) is not None
                info = final.stat()
                await asyncio.sleep(0.1)  # the last events
        finally:
            recorder.cancel()
            out, _ = watcher.communicate("", timeout=10)
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == mode and info.st_gid == gid
    assert json.loads(out) == [[stat.S_IFSOCK | mode, gid]], "the stat loop saw other permissions"
    on_final = [mask for mask, name in events if name == SOCKET]
    assert on_final[0] & Mask.MOVED_TO, events
    assert not any(mask & (Mask.CREATE | Mask.ATTRIB) for mask in on_final), events
    created = [name for mask, name in events if mask & Mask.CREATE and name not in KUBELETS_FILES]
    assert created and all(name.startswith(BIND_DIR_PREFIX) for name in created), events
    assert bind_dirs(plugin_dir) == []


def connect_as_nobody(path: Path) -> str:
    """Try to connect to the socket as nobody:nogroup with no other groups (a sidecar reader).

    The child drops to nobody itself: subprocess's user= switches after fork, which a
    multi-threaded process like this one (gRPC) cannot do safely."""
    code = (
        f"import os, socket, sys\nos.setgroups([])\nos.setgid({NOGROUP})\nos.setuid({NOBODY})\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1])\n"
        "except PermissionError:\n    print('denied')\n"
        "else:\n    print('ok')\n"
    )
    assert NOBODY_PYTHON is not None
    done = subprocess.run([NOBODY_PYTHON, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@needs_nobody
async def test_a_reader_in_the_configured_group_can_connect_and_others_cannot(plugin_dir: Path) -> None:
    """Mode 0660 with group nogroup lets a process of that group (a sidecar running as another
    user) connect; the default 0600 keeps that same process out."""
    plugin_dir.chmod(0o755)  # as the kubelet's directory is: the socket's mode decides
    for socket_settings, expected in (({"mode": "0660", "group": NOGROUP}, "ok"), ({}, "denied")):
        async with devshim(plugin_dir, socket=socket_settings) as (kubelet, _):
            await kubelet.wait_for_plugin(FOO, timeout=WAIT_S)
            assert await asyncio.to_thread(connect_as_nobody, plugin_dir / SOCKET) == expected


def leftover(directory: Path, name: str, age_s: float) -> Path:
    """A private bind directory as a devshim that died mid-bind leaves it: a socket inside."""
    path = directory / name
    path.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path / BIND_NAME))
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


@pytest.mark.parametrize("cleanup", [CleanupMode.KUBELET_1_25, CleanupMode.KUBELET_1_33])
async def test_an_old_leftover_private_directory_is_removed_and_a_young_one_breaks_nothing(
    plugin_dir: Path, cleanup: CleanupMode
) -> None:
    """A private directory older than a minute is a dead devshim's leftover: removed at the next
    bind. A young one may be another devshim's bind in progress (a rolling update): kept, and
    neither devshim nor the kubelet's directory cleanup on restart trips over it."""
    old = leftover(plugin_dir, f"{BIND_DIR_PREFIX}deadbeef", age_s=120)
    young = leftover(plugin_dir, f"{BIND_DIR_PREFIX}cafef00d", age_s=0)
    async with devshim(plugin_dir) as (kubelet, _):
        await kubelet.wait_for_registration(FOO, timeout=WAIT_S)
        assert not old.exists() and young.exists()
        await kubelet.restart(cleanup=cleanup)
        await kubelet.wait_for_registration(FOO, count=2, timeout=WAIT_S)
        session = await kubelet.wait_for_plugin(FOO, timeout=WAIT_S)
        assert len(await session.wait_for_list()) == 2
        assert young.is_dir() and bind_dirs(plugin_dir) == [young.name]


def test_the_private_bind_path_fits_where_the_final_path_is_checked() -> None:
    """Settings refuse a socket directory too long for the private bind path (sun_path), with
    the length the bind really adds."""
    directory = Path("/var/lib/kubelet/device-plugins")
    bind = directory / f"{BIND_DIR_PREFIX}0123abcd" / BIND_NAME
    assert len(str(bind)) - len(str(directory)) == PRIVATE_BIND_EXTRA
    assert len(str(directory)) + PRIVATE_BIND_EXTRA <= MAX_SOCKET_PATH


@pytest.mark.skipif(not can_drop_capabilities(), reason="needs root and setpriv that may drop capabilities")
async def test_without_the_privilege_to_set_the_group_no_socket_is_published(plugin_dir: Path) -> None:
    """devshim as root without CAP_CHOWN cannot give its socket a group it is not in: it says so,
    and publishes no socket with the wrong group rather than one the client cannot use."""
    env = {**os.environ, "DEVSHIM_SOCKET__MODE": "0660", "DEVSHIM_SOCKET__GROUP": "nogroup"}
    devshim = await asyncio.create_subprocess_exec(
        *("setpriv", "--bounding-set=-chown", "--"),
        *(sys.executable, "-m", "shim", "run", "--device-plugins-dir", str(plugin_dir), "-r", f"{FOO}=1"),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert devshim.stderr is not None
    try:
        async with asyncio.timeout(WAIT_S):
            while b"cannot serve" not in (line := await devshim.stderr.readline()):
                assert line, "devshim ended"
    finally:
        devshim.terminate()
        await devshim.wait()
    expected = "group nogroup: Operation not permitted (a group devshim is not a member of needs CAP_CHOWN)"
    assert expected in line.decode()
    assert [p.name for p in plugin_dir.iterdir() if p.name.endswith(".sock")] == []
    assert bind_dirs(plugin_dir) == []

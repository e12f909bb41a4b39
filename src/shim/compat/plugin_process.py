"""Starting and stopping the plugin under test, and running one that hard-codes its directory.

A plugin that hard-codes /var/lib/kubelet/device-plugins runs in a private mount namespace with
the cell's directory bound over that path: the socket inodes are shared, so the fake kubelet
outside and the plugin inside meet, and the host's directory (a real kubelet's, maybe) is never
touched. Making the namespace needs root.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from loguru import logger

from shim.driverhost.reaper import REAPER, descendants

from .results import Failed, Skip

KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
STOP_GRACE_S = 5.0
USE_DIR = "pass {dir} in the command instead"
NEEDS_ROOT = (
    f"the plugin uses {KUBELET_DIR} and running it in a private mount namespace needs root; {USE_DIR}"
)
# Tries at fitting two starts of the plugin into one second (crash_twice_in_a_second).
SAME_SECOND_TRIES = 5
# Binds $1 over $2 inside the namespace, then becomes the plugin (same pid: signals reach it).
_BIND_AND_EXEC = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'


async def start_plugin(
    argv: list[str], env: Mapping[str, str], log: Path, *, append: bool = False
) -> asyncio.subprocess.Process:
    """The plugin in a process group of its own (stop_plugin ends all of it), output to `log`
    (after what an earlier start wrote there, with ``append``)."""
    with log.open("ab" if append else "wb") as out:
        try:
            return await asyncio.create_subprocess_exec(
                *argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as err:
            raise Failed(f"could not start the plugin: {err}") from None


async def stop_plugin(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the plugin's process group, SIGKILL after STOP_GRACE_S; then what it started,
    in its group or not (_end_family)."""
    family = descendants(process.pid)
    _signal_group(process.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(STOP_GRACE_S):
            await process.wait()
    except TimeoutError:
        family |= descendants(process.pid)
        _signal_group(process.pid, signal.SIGKILL)
        await process.wait()
    _end_family(process.pid, family)


async def kill_plugin(process: asyncio.subprocess.Process) -> None:
    """SIGKILL to the plugin and everything it started, as an OOM kill ends it: nothing cleaned up."""
    family = descendants(process.pid)
    _signal_group(process.pid, signal.SIGKILL)
    await process.wait()
    _end_family(process.pid, family)


async def crash_twice_in_a_second(
    restart: Callable[[], Awaitable[None]], came_up: Callable[[], Awaitable[None]]
) -> None:
    """The plugin killed and started again (``restart``), up again (``came_up``), then killed and
    started again at once: the first start as a second begins, so both fall in one second unless
    the plugin takes longer than that to come up (then tried again, SAME_SECOND_TRIES in all, and
    Skip if it never fits: a check that could not make its condition must not pass)."""
    for _ in range(SAME_SECOND_TRIES):
        await asyncio.sleep(math.ceil(time.time()) - time.time() + 0.01)
        first = time.time()
        await restart()
        await came_up()
        if int(time.time()) == int(first):
            await restart()
            return
    raise Skip(
        f"the plugin took over a second to come up after each of {SAME_SECOND_TRIES} restarts, so no "
        f"second start could fall within the second of the first (a busy machine?)"
    )


async def until_ready(
    ready: Callable[[], bool],
    process: asyncio.subprocess.Process | None,
    timeout: float,
    what: str,
    log_tail: Callable[[], str],
    rejections: Callable[[], str] = str,
) -> None:
    """Until ``ready()``, failing early when the plugin ``process`` exits; each failure says
    ``what`` the plugin did not do and ends with the plugin's log (after any ``rejections``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ready():
        if process is not None and process.returncode is not None:
            raise Failed(f"the plugin exited with {process.returncode} before it did {what}{log_tail()}")
        if loop.time() > deadline:
            raise Failed(f"the plugin did not {what} within {timeout:g} s{rejections()}{log_tail()}")
        await asyncio.sleep(0.02)


def sockets_made(directory: Path, since: float) -> set[str]:
    """The unix sockets in ``directory`` made at ``since`` (time.time()) or later. Made again at
    its path, a socket is new though it may get its old inode back: it is told by its change
    time, which the kernel takes from a clock a few milliseconds coarse (so the margin)."""
    made, after = set(), int((since - 0.05) * 1e9)
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            with contextlib.suppress(FileNotFoundError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISSOCK(info.st_mode) and info.st_ctime_ns >= after:
                    made.add(entry.name)
    return made


def _end_family(pid: int, family: set[int]) -> None:
    """What the plugin started, once the plugin is gone. Its group gets SIGKILL; a child in a
    session of its own escapes that, but came to us (orphans_ended made compat a subreaper) and
    is killed and reaped here, by pid, before the next cell. A daemon that was orphaned before
    (found in no plugin's family) is killed when compat ends."""
    _signal_group(pid, signal.SIGKILL)
    REAPER.kill_adopted(among=family)


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)  # start_new_session: the group id is the plugin's pid


@contextlib.contextmanager
def orphans_ended() -> Iterator[None]:
    """compat's cells, as `devshim run` its drivers: this process is a child subreaper, so what a
    plugin or driver under test started and left (a child in a session of its own, a daemon)
    becomes its child rather than init's, and whatever of that still runs at the end is killed
    and reaped. Children this process had before the block are left alone."""
    before = REAPER.adopted()
    if not REAPER.become_subreaper():
        logger.warning("cannot become a child subreaper: what the cells leave running may outlive compat")
    try:
        yield
    finally:
        REAPER.kill_adopted(among=REAPER.adopted() - before)


@asynccontextmanager
async def in_namespace(plugin_dir: Path, argv: list[str]) -> AsyncIterator[list[str]]:
    """`argv` wrapped to run in a private mount namespace where KUBELET_DIR is `plugin_dir`; the
    mount points made for it are removed afterwards. Skip where no namespace can be made."""
    if os.geteuid() != 0:
        raise Skip(NEEDS_ROOT)
    unshare = shutil.which("unshare")
    if unshare is None:
        raise Skip(f"the plugin uses {KUBELET_DIR} and no unshare(1) (util-linux) was found; {USE_DIR}")
    created = make_mount_point(KUBELET_DIR)
    try:
        wrap = [unshare, "--mount", "--propagation", "private", "--"]
        # A trial bind first, so a namespace that cannot be made is a Skip, not a silent plugin.
        pipe, devnull, stdout = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL, asyncio.subprocess.STDOUT
        bind = ["mount", "--bind", str(plugin_dir), str(KUBELET_DIR)]
        trial = await asyncio.create_subprocess_exec(*wrap, *bind, stdin=devnull, stdout=pipe, stderr=stdout)
        output, _ = await trial.communicate()
        if trial.returncode != 0:
            why = output.decode(errors="replace").strip()
            raise Skip(f"the plugin uses {KUBELET_DIR} and unshare failed ({why}); {USE_DIR}")
        yield [*wrap, "sh", "-c", _BIND_AND_EXEC, "devshim-compat", str(plugin_dir), str(KUBELET_DIR), *argv]
    finally:
        remove_mount_points(created)


def make_mount_point(point: Path) -> list[Path]:
    """Create `point` and its missing parents, for a namespace to mount on; the ones created,
    outermost first (remove_mount_points takes them away again)."""
    missing = [p for p in (point, *point.parents) if not p.exists()]
    created = []
    for path in reversed(missing):
        path.mkdir()
        created.append(path)
    return created


def remove_mount_points(created: list[Path]) -> None:
    """Remove what make_mount_point created, innermost first, where still empty."""
    for path in reversed(created):
        with contextlib.suppress(OSError):  # no longer empty: someone else uses it now
            path.rmdir()

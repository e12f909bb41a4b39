"""Starting and stopping the plugin under test, and running one that hard-codes its directory.

A plugin that hard-codes /var/lib/kubelet/device-plugins runs in a private mount namespace with
the cell's directory bound over that path: the socket inodes are shared, so the fake kubelet
outside and the plugin inside meet, and the host's directory (a real kubelet's, maybe) is never
touched. Making the namespace needs root.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from .results import Failed, Skip

KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
STOP_GRACE_S = 5.0
USE_DIR = "pass {dir} in the command instead"
NEEDS_ROOT = (
    f"the plugin uses {KUBELET_DIR} and running it in a private mount namespace needs root; {USE_DIR}"
)
# Binds $1 over $2 inside the namespace, then becomes the plugin (same pid: signals reach it).
_BIND_AND_EXEC = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'


async def start_plugin(argv: list[str], env: Mapping[str, str], log: Path) -> asyncio.subprocess.Process:
    """The plugin in a process group of its own (stop_plugin ends all of it), output to `log`."""
    with log.open("wb") as out:
        try:
            return await asyncio.create_subprocess_exec(
                *argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL, stdout=out,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as err:
            raise Failed(f"could not start the plugin: {err}") from None


async def stop_plugin(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to the plugin's process group, SIGKILL after STOP_GRACE_S; stragglers too."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(STOP_GRACE_S):
            await process.wait()
    except TimeoutError:
        _signal_group(process.pid, signal.SIGKILL)
        await process.wait()
    _signal_group(process.pid, signal.SIGKILL)  # whatever it started in its group


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)  # start_new_session: the group id is the plugin's pid


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

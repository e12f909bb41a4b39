"""devshim as a real process (`python -m shim`): its command, its children, its ops endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

DEVSHIM = [sys.executable, "-m", "shim"]


async def start_devshim(*args: str) -> asyncio.subprocess.Process:
    """`devshim ARGS...`, its stdout and stderr piped."""
    return await asyncio.create_subprocess_exec(
        *DEVSHIM, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


@asynccontextmanager
async def devshim(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`devshim ARGS...` running for the block, killed on the way out if it has not exited."""
    proc = await start_devshim(*args)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()


def children(pid: int) -> set[int]:
    """The process IDs of the children of ``pid`` (from /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            found |= {int(child) for child in (task / "children").read_text().split()}
    return found


def kill_children(pid: int) -> None:
    """SIGKILL every child of ``pid`` (devshim's drivers: a crash, as the searches make one)."""
    for child in children(pid):
        with contextlib.suppress(ProcessLookupError):  # ended on its own meanwhile
            os.kill(child, signal.SIGKILL)


def runs(pid: int) -> bool:
    """The process runs: it exists and is not a zombie waiting for its parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def http_get(url: str) -> tuple[int, str]:
    """The status and body of a GET of ``url`` (an error status too, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()

"""One run of a driver program: its process, its JSON-RPC peer, and the first failure seen.

Every way a driver can fail (it exits, breaks the protocol, does not answer in
time, floods notifications) ends in ``fail(reason)``: pending calls fail with
that reason and ``failed`` resolves once, so the supervisor has one code path.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
import time
from typing import Any

from loguru import logger

from shim.jsonrpc import MAX_LINE_BYTES, ConnectionClosed, Peer, StreamTransport
from shim.jsonrpc.errors import ProtocolError
from shim.jsonrpc.peer import NotificationHandler
from shim.settings import DriverSettings

# Run first in the child: PR_SET_PDEATHSIG makes the kernel kill the driver if devshim
# dies, even by SIGKILL, so no driver outlives it. Done in a fresh process rather than
# in preexec_fn, which is unsafe in devshim's multi-threaded (gRPC) process.
LAUNCHER = r"""
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() == 1:
    sys.exit(70)  # devshim died before the death signal was armed
try:
    os.execvp(sys.argv[1], sys.argv[1:])
except OSError as error:
    sys.stderr.write(f"cannot run {sys.argv[1]!r}: {error.strerror}\n")
    sys.exit(127)
"""


class DriverFailed(Exception):
    """A driver run ended or could not start; the message says why."""


class DriverProcess:
    def __init__(self, settings: DriverSettings, notifications: dict[str, NotificationHandler]) -> None:
        self.settings = settings
        self.name = settings.name
        self.failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.process: asyncio.subprocess.Process | None = None
        self._notifications = {m: self._rate_limited(m, h) for m, h in notifications.items()}
        self._window = (0.0, 0)
        self.last_log = ""
        self._peer: Peer | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        program, *args = self.settings.command
        # A bare name is looked up on devshim's own PATH: the driver's environment is exactly its
        # configured env, often without PATH, and `command: [devshim-sim, ...]` should still work.
        found = program if "/" in program else shutil.which(program)
        if found is None:
            raise DriverFailed(f"cannot start {program!r}: not found on devshim's PATH")
        argv = [found, *args]
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-c", LAUNCHER, *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(self.settings.env),
                limit=MAX_LINE_BYTES,
            )  # fmt: skip
        except OSError as exc:
            raise DriverFailed(f"cannot start {argv[0]!r}: {exc.strerror}") from None
        assert self.process.stdout and self.process.stdin and self.process.stderr
        self._peer = Peer(
            StreamTransport(self.process.stdout, self.process.stdin),
            name=f"driver {self.name!r}",
            notifications=self._notifications,
        )
        self._peer.on_close = self._on_output_closed
        self._tasks = [
            asyncio.create_task(self._peer.run()),
            asyncio.create_task(self._watch_exit(self.process)),
            asyncio.create_task(self._copy_log(self.process.stderr)),
        ]

    def _on_output_closed(self, reason: BaseException) -> None:
        if isinstance(reason, ProtocolError):
            self.fail(f"it broke the protocol: {reason}")
        elif not self.failed.done():
            # Usually the driver is exiting: let its exit status tell why.
            self._tasks.append(asyncio.create_task(self._expect_exit()))

    async def _expect_exit(self) -> None:
        assert self.process is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), 2.0)
            return
        self.fail("it closed its output but kept running")

    def fail(self, reason: str) -> None:
        """Record the first failure and fail every pending call with it."""
        if self.failed.done():
            return
        self.failed.set_result(reason)
        if self._peer is not None:
            self._peer.abort(ConnectionClosed(reason))

    async def request(self, method: str, params: Any, timeout: float, *, hang_is_failure: bool = True) -> Any:
        if self._peer is None or self.failed.done():
            raise ConnectionClosed(self.failed.result() if self.failed.done() else "not started")
        try:
            return await self._peer.request(method, params, timeout)
        except TimeoutError:
            reason = f"it did not answer {method} within {timeout:g} s"
            if hang_is_failure:
                # A driver that stops answering is hung: restart it rather than wait forever.
                self.fail(reason)
            raise TimeoutError(reason) from None
        except ConnectionClosed as exc:
            # The stream ended before the exit status is known: wait briefly for the real reason.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.failed), 2.0)
            raise ConnectionClosed(self.failed.result() if self.failed.done() else str(exc)) from None

    async def _watch_exit(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._tasks[2]), 0.5)  # its last log lines
        if code == 127 and self.last_log.startswith("cannot run"):
            how = self.last_log
        elif code == 70:
            how = "its launcher found devshim gone"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        self.fail(how if code == 127 and how.startswith("cannot run") else f"it {how}")

    def _rate_limited(self, method: str, handler: NotificationHandler) -> NotificationHandler:
        limit = self.settings.restart.max_notifications_per_s

        def handle(params: Any) -> None:
            if self.failed.done():
                return  # from a run devshim already gave up on: its word no longer counts
            start, count = self._window
            now = time.monotonic()
            if now - start >= 1.0:
                start, count = now, 0
            self._window = (start, count + 1)
            if count + 1 > limit:
                self.fail(f"it flooded devshim with more than {limit} notifications in one second")
                return
            handler(params)

        return handle

    async def _copy_log(self, stderr: asyncio.StreamReader) -> None:
        with contextlib.suppress(ValueError, ConnectionError):
            async for line in stderr:
                self.last_log = line.decode(errors="replace").rstrip()
                logger.info("driver {!r}: {}", self.name, self.last_log)

    async def stop(self, *, graceful: bool) -> None:
        """graceful: shutdown, then close stdin; then SIGTERM, then SIGKILL; each bounded."""
        wait_s = self.settings.timeouts.shutdown_s
        if graceful and not self.failed.done():
            with contextlib.suppress(Exception):
                await self.request("shutdown", {}, wait_s)
        self.fail("devshim stopped it")
        if self._peer is not None:
            await self._peer.close()
        if self.process is not None:
            await self._reap(self.process, wait_s if graceful else 1.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @staticmethod
    async def _reap(process: asyncio.subprocess.Process, wait_s: float) -> None:
        """Wait for a voluntary exit, then SIGTERM, then SIGKILL: never leave a zombie."""
        for escalate in (None, process.terminate, process.kill):
            if process.returncode is not None:
                return
            if escalate is not None:
                escalate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), wait_s)

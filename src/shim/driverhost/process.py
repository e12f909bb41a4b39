"""One run of a driver program: its process, its JSON-RPC peer, and the first failure seen.

Every way a driver can fail (it exits, breaks the protocol, does not answer in
time, floods notifications) ends in ``fail(reason)``: pending calls fail with
that reason and ``failed`` resolves once, so the supervisor has one code path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

from loguru import logger

from shim.driverhost import limits, protocol
from shim.driverhost.identity import Identity, IdentityError, identity
from shim.driverhost.reaper import REAPER
from shim.driverhost.stderr import StderrLines
from shim.jsonrpc import ConnectionClosed, Peer, StreamTransport
from shim.jsonrpc.errors import ProtocolError
from shim.jsonrpc.peer import NotificationHandler
from shim.jsonrpc.sliced import SlicedReader
from shim.settings import DriverSettings

# Run first in the child, in a fresh process rather than in preexec_fn, which is unsafe in
# devshim's multi-threaded (gRPC) process. Arguments: devshim's pid; the ids to switch to,
# "uid:gid:group,group" (uid empty: keep it), or "" to keep devshim's; the driver's argv.
# PR_SET_PDEATHSIG makes the kernel kill the driver if devshim dies, even by SIGKILL, so no
# driver outlives it; it comes after the switch, because changing ids clears it. The ids
# change groups first: once the uid is dropped, changing groups is no longer permitted.
# The driver gets the environment the launcher was started with, read back from /proc (before
# the switch makes /proc/self root's): the interpreter adds LC_CTYPE to its own when the locale
# is C (PEP 538).
LAUNCHER = r"""
import ctypes, os, signal, sys
parent, ids, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
try:
    with open("/proc/self/environ", "rb") as given:
        env = dict(e.split(b"=", 1) for e in given.read().split(b"\0") if b"=" in e)
except OSError:
    env = dict(os.environb)
if ids:
    uid, gid, groups = ids.split(":")
    try:
        os.setgroups([int(g) for g in groups.split(",")])
        os.setgid(int(gid))
        if uid:
            os.setuid(int(uid))
    except OSError as error:
        who = f"uid {uid or os.getuid()}, gid {gid}, groups {groups}"
        sys.stderr.write(f"cannot run as {who}: {error.strerror}\n")
        sys.exit(71)
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    sys.exit(70)  # devshim died before the death signal was armed
try:
    os.execve(argv[0], argv, env)
except OSError as error:
    sys.stderr.write(f"cannot run {argv[0]!r}: {error.strerror}\n")
    sys.exit(127)
"""
# The launcher's exit codes for its own failures.
EXEC_FAILED, SWITCH_FAILED, PARENT_GONE = 127, 71, 70
# How much of the driver's stderr one read takes.
STDERR_CHUNK = 256 * 1024
# How often the exit of a process devshim did not spawn itself is looked for (see exited()).
EXIT_POLL_S = 0.05


class _ExitingProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's own protocol for a subprocess's pipes, which also says when the process exited:
    asyncio calls process_exited as soon as the exit status is known, before the pipes close."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exit: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exit.done():
            self.exit.set_result(None)


# The exit of each process spawned here, as its protocol reports it.
_EXITS: weakref.WeakKeyDictionary[asyncio.subprocess.Process, asyncio.Future[None]] = (
    weakref.WeakKeyDictionary()
)


async def spawn(*argv: str, limit: int, **options: Any) -> asyncio.subprocess.Process:
    """asyncio.create_subprocess_exec, whose exit ``exited`` awaits without a timer."""
    loop = asyncio.get_running_loop()
    pipes = _ExitingProtocol(limit, loop)
    transport, _ = await loop.subprocess_exec(lambda: pipes, *argv, **options)
    process = asyncio.subprocess.Process(transport, pipes, loop)
    _EXITS[process] = pipes.exit
    return process


async def exited(process: asyncio.subprocess.Process) -> int:
    """The exit status, once the process has exited. Not Process.wait(): on Python 3.11 that
    also waits until every pipe to the process is closed, and a child the driver started (the
    legacy adapter's plugin, say) holds its stdout open after the driver itself is gone. A process
    spawned here is awaited through its protocol (an idle driver costs no wake-ups); another is
    polled."""
    exit = _EXITS.get(process)
    if exit is not None:
        await asyncio.shield(exit)
    while process.returncode is None:
        await asyncio.sleep(EXIT_POLL_S)
    return process.returncode


def end_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL whatever is left of the driver's process group (the children it started), once
    the driver itself has exited: a restarted driver must not meet its predecessor's children."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # start_new_session: the group id is the driver's pid


class DriverFailed(Exception):
    """A driver run ended or could not start; the message says why."""


# Why a device list (method, the message holding it, the resource it is for) may not be taken,
# or None: it is read by its length alone, before a device of it is.
ListRefusal = Callable[[str, Any, Any], str | None]


def over_one_list(method: str, message: Any, resource: Any) -> str | None:
    """The bound every list has, whoever runs the driver."""
    refusal = limits.device_list_refusal(method, message, resource)
    return None if refusal is None else f"it broke the protocol: {refusal}"


class DriverProcess:
    def __init__(
        self,
        settings: DriverSettings,
        notifications: dict[str, NotificationHandler],
        refuse_list: ListRefusal = over_one_list,
    ) -> None:
        self.settings = settings
        self._refuse_list = refuse_list
        self.name = settings.name
        self.failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.process: asyncio.subprocess.Process | None = None
        self._notifications = {m: self._rate_limited(m, h) for m, h in notifications.items()}
        self._window = (0.0, 0)
        self.last_log = ""
        self._peer: Peer | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.hung = False  # failed by not answering in time: maybe frozen, deaf to EOF and SIGTERM
        self.identity: Identity | None = None  # who it runs as (None: as devshim)

    async def start(self) -> None:
        program, *args = self.settings.command
        # A bare name is looked up on devshim's own PATH: the driver's environment is exactly its
        # configured env, often without PATH, and `command: [devshim-sim, ...]` should still work.
        found = program if "/" in program else shutil.which(program)
        if found is None:
            raise DriverFailed(f"cannot start {program!r}: not found on devshim's PATH")
        argv = [found, *args]
        try:
            self.identity = identity(self.settings)
        except IdentityError as exc:
            raise DriverFailed(f"cannot start it: {exc}") from None
        if self.identity is not None and self.identity.withheld:
            withheld = "; ".join(self.identity.withheld)
            logger.info("driver {!r}: device groups withheld: {}", self.name, withheld)
        ids = "" if self.identity is None else self.identity.launcher_argument()
        try:
            with REAPER.spawning():
                self.process = await self._spawn(ids, argv)
                REAPER.own(self.process.pid)
        except OSError as exc:
            raise DriverFailed(f"cannot start {argv[0]!r}: {exc.strerror}") from None
        assert self.process.stdout and self.process.stdin and self.process.stderr
        self._peer = Peer(
            limits.BoundedTransport(
                StreamTransport(self.process.stdout, self.process.stdin, limit=limits.MAX_MESSAGE_BYTES)
            ),
            name=f"driver {self.name!r}",
            notifications=self._notifications,
            # Long device lists are read in slices, unchanged devices not again (jsonrpc/sliced.py).
            read=SlicedReader(
                protocol.device_from_json,
                keep_chars=limits.MAX_MESSAGE_BYTES,
                max_elements=limits.MAX_DEVICES_PER_LIST,
            ).read,
        )
        self._peer.on_close = self._on_output_closed
        self._tasks = [
            asyncio.create_task(self._peer.run()),
            asyncio.create_task(self._watch_exit(self.process)),
            asyncio.create_task(self._copy_log(self.process.stderr)),
        ]

    async def _spawn(self, ids: str, argv: list[str]) -> asyncio.subprocess.Process:
        return await spawn(
            sys.executable, "-I", "-S", "-c", LAUNCHER, str(os.getpid()), ids, *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(self.settings.env),
            # Not the framing's 32 MiB: a longer message is refused before it is buffered.
            limit=limits.MAX_MESSAGE_BYTES,
            # A group of its own, so its children can be ended with it (end_group).
            start_new_session=True,
        )  # fmt: skip

    def _on_output_closed(self, reason: BaseException) -> None:
        if isinstance(reason, ProtocolError):
            self.fail(f"it broke the protocol: {reason}")
            assert self.process is not None and self.process.stdout is not None
            self._tasks.append(asyncio.create_task(self._discard(self.process.stdout)))
        elif not self.failed.done():
            # Usually the driver is exiting: let its exit status tell why.
            self._tasks.append(asyncio.create_task(self._expect_exit()))

    @staticmethod
    async def _discard(stdout: asyncio.StreamReader) -> None:
        """Read what a driver broken by what it wrote still writes, until it is stopped. Unread,
        its output would pile up in the reader (a line refused at the byte bound is still being
        written) up to twice the bound, and the pipe, paused, would never see its end."""
        with contextlib.suppress(ConnectionError):
            while await stdout.read(STDERR_CHUNK):
                pass

    async def _expect_exit(self) -> None:
        assert self.process is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await exited(self.process)
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
            result = await self._peer.request(method, params, timeout)
        except TimeoutError:
            reason = f"it did not answer {method} within {timeout:g} s"
            if hang_is_failure:
                # A driver that stops answering is hung: restart it rather than wait forever.
                self.hung = True
                self.fail(reason)
            raise TimeoutError(reason) from None
        except ConnectionError as exc:
            # Our write found the driver's input closed: it died as we wrote (its exit status, if
            # it comes at once, is the better reason) or it no longer reads. Either way it is broken.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await asyncio.shield(self.failed)
            self.fail(f"it closed its input ({exc})")
            raise ConnectionClosed(self.failed.result()) from None
        except ConnectionClosed as exc:
            # The stream ended before the exit status is known: wait briefly for the real reason.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await asyncio.shield(self.failed)
            raise ConnectionClosed(self.failed.result() if self.failed.done() else str(exc)) from None
        if method == "list_devices" and self._over_device_bound(method, result, params):
            raise ConnectionClosed(self.failed.result())
        return result

    def _over_device_bound(self, method: str, message: Any, params: Any) -> bool:
        """A device list over a bound (of one list, of the driver's devices, of devshim's) fails
        the run, as a line too long does (its devices Unhealthy, restarted), before a device of
        it is read. Nothing runs between this check and the list's being taken (the caller parses
        and takes it synchronously), so two lists cannot both pass against the same count."""
        resource = params.get("resource") if isinstance(params, dict) else None
        refusal = self._refuse_list(method, message, resource)
        if refusal is not None:
            self.fail(refusal)
        return refusal is not None

    async def _watch_exit(self, process: asyncio.subprocess.Process) -> None:
        code = await exited(process)
        REAPER.disown(process.pid)
        end_group(process)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.5):
                await asyncio.shield(self._tasks[2])  # its last log lines
        if code in (EXEC_FAILED, SWITCH_FAILED) and self.last_log.startswith("cannot run"):
            reason = self.last_log
            if code == SWITCH_FAILED and "not permitted" in reason:
                reason += " (running a driver as another user or group needs CAP_SETUID and CAP_SETGID)"
        elif code == PARENT_GONE:
            reason = "its launcher found devshim gone"
        elif code < 0:
            reason = f"it was killed by {signal.Signals(-code).name}"
        else:
            reason = f"it exited with code {code}"
        if self.last_log and reason != self.last_log:
            # Usually why (a missing variable, module or file): where status and compat show it.
            reason += f"; its last stderr line: {self.last_log[:300]}"
        if self.identity is not None and self.identity.default and "Permission denied" in reason:
            reason += (
                f" (it runs as {self.identity}, unprivileged by default: make its program and files "
                f"readable by that user, or set drivers[{self.name}].user; docs/configuration.md, "
                '"Who a driver runs as")'
            )
        self.fail(reason)

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
            if method == "devices_changed" and self._over_device_bound(method, params, params):
                return
            handler(params)

        return handle

    async def _copy_log(self, stderr: asyncio.StreamReader) -> None:
        """Read all the driver writes to stderr, at once and to the end, so that it never blocks
        on a full pipe; only a bounded part of it reaches the log (driverhost/stderr.py)."""
        loop = asyncio.get_running_loop()
        limits = self.settings.stderr
        lines = StderrLines(limits.max_line_bytes, limits.max_lines_per_s, self._log_stderr)
        try:
            while chunk := await stderr.read(STDERR_CHUNK):
                lines.feed(chunk, loop.time())
                if (end := lines.summary_due()) is not None:
                    loop.call_at(end, lines.end_window, end)
        except ConnectionError:
            pass
        finally:
            lines.close(loop.time())

    def _log_stderr(self, level: str, text: str) -> None:
        if level == "INFO":
            self.last_log = text
        logger.log(level, "driver {!r}: {}", self.name, text)

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
            if not graceful and self.hung and self.process.returncode is None:
                # A hung driver may be frozen (stopped, or stuck in the kernel): it acts on neither
                # EOF nor SIGTERM, and waiting for either only delays its replacement.
                self.process.kill()
            await self._reap(self.process, wait_s if graceful else 1.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @staticmethod
    async def _reap(process: asyncio.subprocess.Process, wait_s: float) -> None:
        """Wait for a voluntary exit, then SIGTERM, then SIGKILL: never leave a zombie; then end
        what is left of its group."""
        for escalate in (None, process.terminate, process.kill):
            if process.returncode is not None:
                break
            if escalate is not None:
                escalate()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await exited(process)
        end_group(process)

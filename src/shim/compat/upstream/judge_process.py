"""Requests to one of the judge's Go programs: a JSON line in, a JSON line out, one at a time.

The device-manager harness and the DRA manager (judges/harness, judges/dra) speak the same
protocol: ``{"id", "op", ...}`` answered by ``{"id", "ok", "result" | "error"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from shim.compat.plugin_process import stop_plugin
from shim.compat.results import Failed
from shim.compat.tails import log_tail

from .releases import Release

# The kubelet gives a plugin's calls no deadline of its own, or 45 s at most (the DRA manager's
# client): a request waits a little longer, so the manager's own error comes back, not ours.
CALL_TIMEOUT_S = 60.0
# One reply line at most (a list of thousands of devices fits easily).
REPLY_LIMIT = 16 * 1024 * 1024
LOG_TAIL = 1500


class Wired(Protocol):
    def wire(self) -> dict[str, Any]: ...


class JudgePod:
    """What both judges take of any pod (protocol.go's Pod in judges/harness and judges/dra): who
    it is and its containers. Each judge's Pod, a dataclass, declares these fields with its own
    Container and adds to `wire` what its manager reads besides."""

    uid: str
    name: str
    namespace: str
    containers: Sequence[Wired]
    init_containers: Sequence[Wired]

    def wire(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "name": self.name,
            "namespace": self.namespace,
            "containers": [c.wire() for c in self.containers],
            "init_containers": [c.wire() for c in self.init_containers],
        }


class JudgeProcess:
    """One judge program's process; every call waits at most CALL_TIMEOUT_S."""

    program = "harness"  # how messages name the program
    manager = "device manager"  # the upstream manager it runs
    error: type[Failed] = Failed

    def __init__(self, release: Release, process: asyncio.subprocess.Process, log: Path) -> None:
        self.release = release
        self._process = process
        self._log = log
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int:
        return self._process.pid

    async def call(self, op: str, **args: Any) -> Any:
        request = {"id": next(self._ids), "op": op, **args}
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        name = f"the {self.release.name} {self.program}"
        async with self._lock:
            try:
                async with asyncio.timeout(CALL_TIMEOUT_S):
                    stdin.write(json.dumps(request).encode() + b"\n")
                    await stdin.drain()
                    line = await stdout.readline()
            except TimeoutError:
                raise self.error(
                    f"the {self.release.name} {self.manager} did not answer {op} within "
                    f"{CALL_TIMEOUT_S:g} s{self.log_tail()}"
                ) from None
            except (ConnectionError, ValueError) as err:
                raise self.error(f"{name}: {err}{self.log_tail()}") from None
        if not line:
            await self._process.wait()
            raise self.error(f"{name} exited ({self._process.returncode}) during {op}{self.log_tail()}")
        reply = json.loads(line)
        if reply.get("id") != request["id"]:
            raise self.error(f"{name} answered {reply!r} to {op}")
        if not reply.get("ok"):
            raise self.error(f"{self.release.name} {op}: {reply.get('error', 'failed')}")
        return reply.get("result")

    def log_tail(self) -> str:
        text = log_tail(self._log, LOG_TAIL).strip()
        return f"; its log ends: {text}" if text else ""

    async def stop(self) -> None:
        await self.call("stop")


J = TypeVar("J", bound=JudgeProcess)


@asynccontextmanager
async def running_judge(kind: type[J], release: Release, argv: Sequence[str], log: Path) -> AsyncIterator[J]:
    """`argv`, a judge program of `release` (its klog to `log`), as a `kind`; stopped (stop, then
    its process group ended) on the way out."""
    with log.open("ab") as err:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err,
            limit=REPLY_LIMIT, start_new_session=True,
        )  # fmt: skip
    judge = kind(release, process, log)
    try:
        yield judge
    finally:
        if process.returncode is None:
            with contextlib.suppress(Failed):
                await judge.stop()
        await stop_plugin(process)

"""A driver program under test, spoken to as devshim would: JSON lines on its stdin/stdout."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from shim.jsonrpc import MAX_LINE_BYTES

ROOT = Path(__file__).resolve().parents[2]
SIM = [sys.executable, "-m", "adapters.sim"]
MESSAGE_TIMEOUT_S = 10.0


class DriverProcess:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._stderr: list[str] = []
        self._stderr_task = asyncio.create_task(self._collect_stderr())
        # Messages read while waiting for another one, in arrival order.
        self.unmatched: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, *argv: str) -> DriverProcess:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            limit=MAX_LINE_BYTES,
        )
        return cls(process)

    async def _collect_stderr(self) -> None:
        assert self.process.stderr is not None
        async for line in self.process.stderr:
            self._stderr.append(line.decode(errors="replace"))

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()

    async def receive(self, timeout: float = MESSAGE_TIMEOUT_S) -> dict[str, Any]:
        """The driver's next message; fails after ``timeout`` or at the end of its stdout."""
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                line = await self.process.stdout.readline()
        except TimeoutError:
            raise AssertionError(
                f"no message from the driver in {timeout} s; stderr:\n{self.stderr}"
            ) from None
        assert line, f"the driver closed its stdout; stderr:\n{self.stderr}"
        message = json.loads(line)
        assert isinstance(message, dict), line
        return message

    async def wait_for(self, *, id: int | None = None, method: str | None = None) -> dict[str, Any]:
        """The response with ``id`` or the notification ``method``, keeping others for later."""

        def matches(message: dict[str, Any]) -> bool:
            if id is not None:
                return message.get("id") == id and "method" not in message
            return message.get("method") == method and "id" not in message

        for message in self.unmatched:
            if matches(message):
                self.unmatched.remove(message)
                return message
        while not matches(message := await self.receive()):
            self.unmatched.append(message)
        return message

    async def request(self, id: int, method: str, params: Any) -> dict[str, Any]:
        await self.send({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        return await self.wait_for(id=id)

    async def initialize(self, version: str = "1.0.0") -> dict[str, Any]:
        response = await self.request(0, "initialize", {"protocol_version": version})
        assert "result" in response, response
        return response

    async def finish(self, timeout: float = MESSAGE_TIMEOUT_S) -> int:
        """Close its stdin as devshim does after shutdown; its exit status."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            async with asyncio.timeout(timeout):
                return await self.process.wait()
        finally:
            await self.kill()

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        async with asyncio.timeout(MESSAGE_TIMEOUT_S):
            await self._stderr_task


@asynccontextmanager
async def running_sim(config: dict[str, Any], tmp_path: Path) -> AsyncIterator[DriverProcess]:
    """The real simulator (python -m adapters.sim) with ``config``, killed on the way out."""
    config_file = tmp_path / "sim-config.json"
    config_file.write_text(json.dumps(config, default=str))
    sim = await DriverProcess.start(*SIM, "--config", str(config_file))
    try:
        yield sim
    finally:
        await sim.kill()

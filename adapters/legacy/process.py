"""The subprocess form: the adapter starts the legacy plugin and restarts it when it exits."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from loguru import logger

BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 30.0


class LegacyProcess:
    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.argv = list(argv)
        self.env = env
        self.process: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._keep_running())

    async def _keep_running(self) -> None:
        delay = BACKOFF_INITIAL_S
        while True:
            started = asyncio.get_running_loop().time()
            try:
                # Its stdout is not the protocol: send it to our stderr, devshim's log of us.
                self.process = await asyncio.create_subprocess_exec(*self.argv, env=self.env, stdout=2)
            except OSError as exc:
                logger.error("cannot start the legacy plugin {!r}: {}", self.argv[0], exc.strerror)
            else:
                logger.info("started the legacy plugin (pid {})", self.process.pid)
                code = await self.process.wait()
                logger.warning("the legacy plugin exited with code {}; restarting it", code)
            if asyncio.get_running_loop().time() - started >= STABLE_AFTER_S:
                delay = BACKOFF_INITIAL_S
            await asyncio.sleep(delay)
            delay = min(BACKOFF_MAX_S, delay * 2)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        process = self.process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(5):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


def child_env(pairs: Sequence[str]) -> dict[str, str]:
    """KEY=VALUE pairs on top of the adapter's own environment (devshim gave it exactly that)."""
    env = dict(os.environ)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--plugin-env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env

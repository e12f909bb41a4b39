"""The devshim process around a Shim: signals, SIGHUP reload and the ops endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
from collections.abc import AsyncIterator, Callable, Iterator

from loguru import logger

from shim import logs
from shim.bootstrap import Shim
from shim.configfile import ConfigError
from shim.driverhost.reaper import REAPER
from shim.nodeconfig import NodeConfigs
from shim.ops import metrics
from shim.settings import Settings


async def run(
    settings: Settings, reload: Callable[[], Settings] | None = None, node_configs: NodeConfigs | None = None
) -> None:
    """Serve until SIGTERM or SIGINT, then stop drivers, remove our sockets and return. On
    SIGHUP, `reload()` reads the settings again and the Shim applies them; a config that does
    not load is logged and changes nothing. With ``node_configs`` the node's label chooses the
    config (shim/nodeconfig.py): read before serving, and a change applied as SIGHUP applies one."""
    _reuse_large_buffers()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reloads = _Reloads()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reloads.ask, "SIGHUP")
    following = None
    if node_configs is not None:
        following = asyncio.create_task(node_configs.follow(lambda: reloads.ask("node label")))
        settings = await _node_config(settings, node_configs, reloads, stop)
    try:
        if not stop.is_set():
            with _adopting_orphans(loop):
                await _serve(settings, reload, stop, reloads)
    finally:
        if following is not None:
            following.cancel()
            await asyncio.wait([following])


class _Reloads:
    """Requests to reload the config (SIGHUP, a changed node label), coalesced, with the last
    one's reason."""

    def __init__(self) -> None:
        self._asked = asyncio.Event()
        self._why = "SIGHUP"

    def ask(self, why: str) -> None:
        self._why = why
        self._asked.set()

    def clear(self) -> None:
        self._asked.clear()

    async def wait(self) -> str:
        await self._asked.wait()
        self._asked.clear()
        return self._why


async def _node_config(
    default: Settings, configs: NodeConfigs, reloads: _Reloads, stop: asyncio.Event
) -> Settings:
    """The config the node's label names, before serving; the default where the label is not read
    within node_configs.wait_s (a change once it is reloads) or names a config that does not load."""
    waits = [asyncio.create_task(configs.known.wait()), asyncio.create_task(stop.wait())]
    await asyncio.wait(waits, timeout=configs.settings.wait_s, return_when=asyncio.FIRST_COMPLETED)
    for task in waits:
        task.cancel()
    if not configs.known.is_set():
        if not stop.is_set():
            logger.error(
                "node configs: label {} not read within {:g} s: the default config serves until it is",
                configs.settings.label, configs.settings.wait_s,
            )  # fmt: skip
        return default
    name = configs.name
    chosen = default
    if name is not None:
        try:
            chosen = await asyncio.to_thread(configs.load)
        except ConfigError as exc:
            logger.error("node configs: the default config serves: {}", exc)
    if configs.name == name:  # what the label asked for is what starts: no reload for it
        reloads.clear()
    if (chosen.log_level, chosen.log_format) != (default.log_level, default.log_format):
        logs.setup(chosen.log_level, chosen.log_format)
    return chosen


# glibc maps every buffer over about 128 KiB afresh and unmaps it when freed, and its first
# touch of each page is a page fault: copying a driver's 2 MB list (reading it, decoding it,
# encoding it for the kubelet and the inventory) took 2 ms here, 0.2 ms into reused memory, and
# a list at the bound is copied about eight times, on the event loop. So buffers up to the
# longest message (limits.MAX_MESSAGE_BYTES, 10 MB) come from the heap, which keeps up to
# KEPT_FREE_BYTES freed at its top for the next one.
LARGE_BUFFER_BYTES = 16 * 1024 * 1024
KEPT_FREE_BYTES = 32 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)


def _reuse_large_buffers() -> None:
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:  # not glibc (musl has no mallopt): its own allocator as it is
        return
    if not (mallopt(_M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES) and mallopt(_M_TRIM_THRESHOLD, KEPT_FREE_BYTES)):
        logger.warning("cannot set the allocator to reuse large buffers (mallopt refused)")


@contextlib.contextmanager
def _adopting_orphans(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Drivers' orphans come to devshim (PID 1 or subreaper): reaped as they exit, killed at the end."""
    if not REAPER.become_subreaper():
        logger.warning("cannot become a child subreaper: drivers' orphans go to the node's init")
    loop.add_signal_handler(signal.SIGCHLD, REAPER.reap)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGCHLD)
        REAPER.kill_adopted()


async def _serve(
    settings: Settings, reload: Callable[[], Settings] | None, stop: asyncio.Event, reloads: _Reloads
) -> None:
    if settings.http.enabled:  # what /metrics shows; before the Shim builds its RPC handlers
        metrics.enable()
    async with Shim(settings) as shim, _ops_server(shim):
        serving = asyncio.create_task(shim.wait())
        stopping = asyncio.create_task(stop.wait())
        reloading = asyncio.create_task(_reload_when_asked(shim, reloads, reload))
        try:
            await asyncio.wait({serving, stopping, reloading}, return_when=asyncio.FIRST_COMPLETED)
            if serving.done():
                serving.result()
            if reloading.done():
                reloading.result()
            logger.info("signal received; shutting down")
        finally:
            for task in (serving, stopping, reloading):
                task.cancel()
            # asyncio.wait, not `await serving`: a cancellation of run() itself must propagate.
            await asyncio.wait([serving])


@contextlib.asynccontextmanager
async def _ops_server(shim: Shim) -> AsyncIterator[None]:
    """/metrics, /healthz, /readyz and /status while serving. A port that cannot be bound is
    logged, not fatal: the node's devices matter more than their metrics (the readiness probe
    then fails, which shows it)."""
    http = shim.settings.http
    server = None
    if http.enabled:
        from shim.ops.http import OpsServer, OpsThread  # with prometheus_client: only when served

        ops = OpsServer(http.host, http.port, ready=shim.ready, status=shim.status,
                        status_from_anywhere=http.status_from_anywhere)  # fmt: skip
        server = OpsThread(ops)
    if server is not None:
        try:
            await server.start()
            logger.info(
                "ops endpoint: serving /metrics, /healthz, /readyz and /status on {}:{}",
                http.host,
                server.port,
            )
        except OSError as exc:
            logger.error("ops endpoint: cannot listen on {}:{}: {}", http.host, http.port, exc)
            server = None
    try:
        yield
    finally:
        if server is not None:
            await server.stop()


async def _reload_when_asked(shim: Shim, reloads: _Reloads, reload: Callable[[], Settings] | None) -> None:
    while True:
        why = await reloads.wait()
        if reload is None:
            logger.warning("{}: nothing to reload from", why)
            continue
        try:
            # Off the loop: reading the file must not stall the kubelet's calls.
            new = await asyncio.to_thread(reload)
        except ConfigError as exc:
            logger.error("{}: the new config is not used, nothing changed: {}", why, exc)
            continue
        except Exception as exc:  # any other failure to load changes nothing either
            logger.error("{}: the new config is not used, nothing changed: {!r}", why, exc)
            continue
        logger.info("{}: reloading the config", why)
        if (new.log_level, new.log_format) != (shim.settings.log_level, shim.settings.log_format):
            logs.setup(new.log_level, new.log_format)
        await shim.reload(new)

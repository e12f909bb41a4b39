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
from shim.ops import metrics
from shim.settings import Settings


async def run(settings: Settings, reload: Callable[[], Settings] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop drivers, remove our sockets and return. On
    SIGHUP, `reload()` reads the settings again and the Shim applies them; a config that does
    not load is logged and changes nothing."""
    _reuse_large_buffers()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    hangup = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hangup.set)
    with _adopting_orphans(loop):
        await _serve(settings, reload, stop, hangup)


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
    settings: Settings, reload: Callable[[], Settings] | None, stop: asyncio.Event, hangup: asyncio.Event
) -> None:
    if settings.http.enabled:  # what /metrics shows; before the Shim builds its RPC handlers
        metrics.enable()
    async with Shim(settings) as shim, _ops_server(shim):
        serving = asyncio.create_task(shim.wait())
        stopping = asyncio.create_task(stop.wait())
        reloading = asyncio.create_task(_reload_on_hangup(shim, hangup, reload))
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


async def _reload_on_hangup(shim: Shim, hangup: asyncio.Event, reload: Callable[[], Settings] | None) -> None:
    while True:
        await hangup.wait()
        hangup.clear()
        if reload is None:
            logger.warning("SIGHUP: nothing to reload from")
            continue
        try:
            # Off the loop: reading the file must not stall the kubelet's calls.
            new = await asyncio.to_thread(reload)
        except ConfigError as exc:
            logger.error("SIGHUP: the new config is not used, nothing changed: {}", exc)
            continue
        except Exception as exc:  # any other failure to load changes nothing either
            logger.error("SIGHUP: the new config is not used, nothing changed: {!r}", exc)
            continue
        logger.info("SIGHUP: reloading the config")
        if (new.log_level, new.log_format) != (shim.settings.log_level, shim.settings.log_format):
            logs.setup(new.log_level, new.log_format)
        await shim.reload(new)

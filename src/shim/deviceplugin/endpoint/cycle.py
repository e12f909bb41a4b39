"""One resource's plugin endpoint: the I/O around its decisions (machine.py).

Its cycle, repeated for every kubelet restart: serve a fresh server on a fresh socket
(server.py), register (client.py, retried; or wait for the plugin watcher), then serve until a
signal the machine takes for a restart. Signals come from the directory watcher
(``check_files``), the streams (``stream ended``) and the plugin watcher; each is checked against
the facts on disk, so a late or duplicate signal cannot cause a needless cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from loguru import logger
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from shim.core.api import PluginResource
from shim.deviceplugin.api import ApiVersion, ListRefused
from shim.deviceplugin.endpoint import client
from shim.deviceplugin.endpoint.machine import (
    WAKES,
    Action,
    AwaitList,
    KubeletSeen,
    LetGo,
    Machine,
    Refused,
    Registered,
    Registration,
    Reregister,
    Restart,
    ServeOn,
    Step,
)
from shim.deviceplugin.endpoint.server import PluginServer, SocketGone
from shim.facts import KUBELET_SOCKET
from shim.node import sockets
from shim.node.handover import Handover
from shim.ops import metrics
from shim.settings import SocketSettings

# kubelet 1.37's device manager can keep a socket path taken for good: a Register at the path
# that arrives before the old stream's end is handled drops the old client (handler.go
# deregisterClient, by path), so its end never disconnects it, and manager.go PluginConnected
# refuses that path from then on with this message. Only another path registers again.
STALE_PATH = "device plugin already connected"


class _NoKubelet(Exception):
    """kubelet.sock is not there yet: retried, woken when it appears."""


class PluginEndpoint:
    def __init__(
        self,
        resource: PluginResource,
        apis: Sequence[ApiVersion],
        *,
        plugin_dir: Path,
        socket_name: str,
        backoff_max_s: float = 5.0,
        plugins_registry: Path | None = None,
        handover: Handover | None = None,
        socket: SocketSettings | None = None,
    ) -> None:
        """``plugins_registry`` given: register through the kubelet's plugin watcher (a
        registration socket there) instead of calling Register on kubelet.sock. ``handover``:
        take the resource over from another devshim instance first, and let go when asked.
        ``socket``: the socket's permissions (default: owner only)."""
        self.resource = resource
        self.apis = tuple(apis)  # offered newest first, all on one socket
        self.watcher_mode = plugins_registry is not None
        registration = Registration.WATCHER if self.watcher_mode else Registration.CLASSIC
        self._machine = Machine(registration, handover is not None)
        self._handover = handover
        self._socket_name, self._renames = socket_name, 0  # as configured; moves away from it
        self._moves_unregistered = 0  # moves since the last registration taken: paced by backoff
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self._backoff_max_s = backoff_max_s
        self._server = PluginServer(
            resource,
            self.apis,
            (plugins_registry or plugin_dir) / socket_name,
            socket or SocketSettings(),
            on_stream_end=lambda refused: self._act(self._machine.stream_ended(refused)),
            on_watcher_status=(
                (lambda ok, error: self._act(self._machine.watcher_said(ok, error)))
                if self.watcher_mode
                else None
            ),
        )
        self._wake = asyncio.Event()  # the machine moved on: the cycle looks at next_step again
        self._kubelet_seen = asyncio.Event()
        self._told_waiting = False

    @property
    def socket_path(self) -> Path:
        return self._server.socket_path

    # What status shows (shim/status.py).

    @property
    def registered(self) -> bool:
        return self._machine.registered

    @property
    def negotiated(self) -> str:
        return self._machine.negotiated

    @property
    def registrations(self) -> int:
        return self._machine.registrations

    @property
    def watcher_status(self) -> str:
        return self._machine.watcher_status

    @property
    def last_error(self) -> str:
        return self._machine.last_error

    @property
    def waiting(self) -> str:
        """Why it is not registered, where that is the kubelet's socket not being there yet."""
        return f"waiting for the kubelet to create {self.kubelet_socket}" if self._told_waiting else ""

    # --- signals ----------------------------------------------------------------------------

    def check_files(self, name: str | None = None) -> None:
        """React to a directory change (``name`` None: anything may have changed)."""
        asked = self._handover is not None and self._handover.asked(name)
        relevant = name in (None, KUBELET_SOCKET, self.socket_path.name)
        if not asked and not relevant:
            return
        ours = sockets.identity(self.socket_path) if relevant else self._machine.socket
        kubelet = sockets.identity(self.kubelet_socket) if relevant else None
        self._act(self._machine.files_changed(handover_asked=asked, ours=ours, kubelet=kubelet))

    def options_changed(self) -> None:
        """The resource's capabilities changed: register again so the kubelet reads them."""
        self._act(self._machine.options_changed())

    def _act(self, actions: list[Action]) -> None:
        name = self.resource.name
        for action in actions:
            match action:
                case Restart(cause, reason, counted):
                    if counted:
                        metrics.restart_noticed(name, cause)
                    logger.info("{}: {}; registering again", name, reason)
                case Reregister(reason):
                    logger.info("{}: {}; registering again", name, reason)
                case LetGo():
                    logger.info("{}: another devshim instance takes it over; letting go", name)
                case AwaitList():
                    logger.info("{}: serving again once its device list changes", name)
                case KubeletSeen():
                    self._kubelet_seen.set()
                case ServeOn():
                    logger.info("{}: the kubelet ended ListAndWatch; serving on for its return", name)
                case Registered(version):
                    metrics.registration(name, version, ok=True)
                    if version:
                        metrics.negotiated(name, version)
                case Refused(version):
                    metrics.registration(name, version, ok=False)
            if isinstance(action, WAKES):
                self._wake.set()

    # --- the cycle --------------------------------------------------------------------------

    def preflight(self) -> None:
        """Fail at start, not in the background, when our socket path is unusable."""
        sockets.clear_stale_socket(self.socket_path)

    async def run(self) -> None:
        """Serve and stay registered until cancelled; no error ends the cycle."""
        while True:
            self._wake.clear()
            step = self._machine.next_step()
            if step is Step.AWAIT_SUCCESSOR_GONE:
                # Close our streams now, before the new instance registers (node/handover.py).
                await self._close()
                assert self._handover is not None
                why = await self._handover.until_successor_gone()
                logger.warning("{}: {}; serving it again", self.resource.name, why)
                self._machine.successor_gone()
                continue
            if step is Step.AWAIT_ANOTHER_LIST:
                refused = self._machine.refused
                assert refused is not None
                await self._wait_for_another_list(refused)
                self._machine.list_changed()  # unless handed over meanwhile
                continue
            if step is Step.PAUSE_THEN_SERVE:
                await asyncio.sleep(self._backoff_max_s)
            if step is not Step.AWAIT_SIGNAL:
                try:
                    await self._serve_and_register()
                except SocketGone:
                    self._machine.serving_ended()  # serve again at once
                    continue
                except Exception as exc:
                    self._machine.serving_ended()
                    logger.error(
                        "{}: cannot serve: {}; trying again in {}s",
                        self.resource.name,
                        exc,
                        self._backoff_max_s,
                    )
                    await asyncio.sleep(self._backoff_max_s)
                    continue
            await self._wake.wait()

    async def _serve_and_register(self) -> None:
        if self._handover is not None:
            await self._handover.take_over()
        self._machine.served(await self._server.serve_fresh())
        logger.info(
            "{}: serving {} on {}", self.resource.name, ", ".join(a.name for a in self.apis), self.socket_path
        )
        if not self.watcher_mode:
            # Serve first, then register: the kubelet dials us inside Register (>= 1.25).
            retrying = AsyncRetrying(
                retry=retry_if_exception_type((client.RegisterFailed, _NoKubelet)),
                wait=wait_exponential(multiplier=0.05, max=self._backoff_max_s),
                sleep=self._sleep_until_kubelet,
            )
            async for attempt in retrying:
                with attempt:
                    await self._register_once()

    async def _register_once(self) -> None:
        if sockets.identity(self.socket_path) != self._machine.socket:
            raise SocketGone
        self._kubelet_seen.clear()
        kubelet = sockets.identity(self.kubelet_socket)
        self._machine.attempting(kubelet)
        if kubelet is None:
            if not self._told_waiting:
                logger.info(
                    "{}: waiting for the kubelet to create {}", self.resource.name, self.kubelet_socket
                )
                self._told_waiting = True
            raise _NoKubelet
        self._told_waiting = False
        started = time.monotonic()
        try:
            version = await self._unless_woken(
                client.register(self.apis, self.kubelet_socket, self.socket_path.name, self.resource)
            )
        except client.RegisterFailed as failed:
            self._act(self._machine.register_failed(failed.version, failed.error))
            if STALE_PATH in failed.error:
                await self._move()
                raise SocketGone from None  # serve again at once, at the fresh path
            raise
        self._act(self._machine.register_answered(kubelet, version))
        self._moves_unregistered = 0
        logger.info(
            "{}: registered with the kubelet as {} ({} ms)",
            self.resource.name,
            version,
            round((time.monotonic() - started) * 1000),
        )

    async def _move(self) -> None:
        """Serve under a fresh socket name: the kubelet refuses the old path for good. The first
        move is at once; a kubelet refusing every path gets them paced by the register backoff,
        never a busy loop of servers."""
        if self._moves_unregistered:
            await asyncio.sleep(min(self._backoff_max_s, 0.05 * 2 ** (self._moves_unregistered - 1)))
        self._moves_unregistered += 1
        old = self.socket_path
        await self._server.close()
        sockets.remove_own_socket(old, self._machine.socket)
        if self._handover is not None:
            name = self._handover.rename()
        else:
            self._renames += 1
            name = f"{self._socket_name.removesuffix('.sock')}-r{self._renames}.sock"
        self._server.socket_path = old.parent / name
        logger.warning(
            "{}: the kubelet holds {} as already connected, and would refuse it for good; serving "
            "on {} instead", self.resource.name, old.name, name,
        )  # fmt: skip

    async def _unless_woken(self, registering: Coroutine[Any, Any, str]) -> str:
        """The Register's outcome, unless the machine moves on first (our socket deleted, a
        handover): then the attempt is abandoned, since a kubelet dialling a gone socket can only
        time out (10 s), and the cycle serves afresh."""
        register = asyncio.ensure_future(registering)
        woken = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({register, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            if not register.done():
                register.cancel()
            await asyncio.gather(register, woken, return_exceptions=True)
        if register.cancelled():
            raise SocketGone
        return register.result()

    async def _sleep_until_kubelet(self, seconds: float) -> None:
        """Back off, but wake at once when kubelet.sock appears."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._kubelet_seen.wait()

    async def _wait_for_another_list(self, refused: ListRefused) -> None:
        """Not registered (status shows why) until the resource publishes a different list, and
        at least the backoff has passed; or until another instance takes it over. The old server
        stays until then: removing its socket now could make a watcher kubelet disconnect before
        it has read the refusal's status."""

        async def another_list() -> None:
            await asyncio.sleep(self._backoff_max_s)  # a list changing often is no busy loop either
            async with contextlib.aclosing(self.resource.watch()) as lists:
                async for devices in lists:
                    if devices is not refused.devices and devices != refused.devices:
                        return

        waits = [asyncio.create_task(another_list()), asyncio.create_task(self._wake.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _close(self) -> None:
        await self._server.close()
        self._machine.closed()  # no socket of ours until the next: its absence is no signal

    async def close(self) -> None:
        await self._close()
        metrics.endpoint_closed(self.resource.name)

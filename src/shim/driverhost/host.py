"""Supervises one driver: start it, serve its resources, restart it when it fails.

A failure of any kind (docs/driver-protocol.md, "Failures") marks the driver's
devices Unhealthy at once, fails its in-flight calls with the reason, and
restarts it with capped exponential backoff. After ``max_start_failures``
failed starts in a row it stays down, its devices Unhealthy, until devshim
restarts; every other resource keeps being served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from loguru import logger
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from shim import __version__
from shim.driverhost import limits, protocol
from shim.driverhost.process import DriverFailed, DriverProcess, over_one_list
from shim.driverhost.source import DriverSource
from shim.driverhost.stderr import DriverLog
from shim.errors import ClaimRefused, ShimError, SourceUnavailable
from shim.inventory import InventoryStore
from shim.model import Capabilities, CdiSpec
from shim.names import check_extended_resource_name
from shim.ops import metrics
from shim.settings import DriverSettings, Settings, static_device_count
from shim.sources.base import DeviceSource

# Calls worth waiting for while the driver restarts (the kubelet chose a device that was
# Healthy a moment ago); others fail at once or, like preferred_allocation, are optional.
WAIT_FOR_RESTART = frozenset({"allocate", "prestart", "attach", "detach"})
# Advice the kubelet can do without: a slow answer is dropped, the driver is not restarted.
ADVISORY = frozenset({"preferred_allocation"})
# Refused resources logged one by one per message; the rest are counted in one line. A message
# may hold thousands of names, and each reason quotes one (cut to _SHOWN_CHARS).
_REFUSALS_LOGGED = 10
_SHOWN_CHARS = 300


def _as_is(result: Any) -> Any:
    return result


class Devshim(Protocol):
    """What a driver host reads of the devshim it runs in, to bound the devices it holds in all."""

    @property
    def settings(self) -> Settings: ...

    @property
    def drivers(self) -> Sequence[DriverHost]: ...


class ResourceRegistry(Protocol):
    """Where a driver's resources are served (the composition root implements it)."""

    @property
    def shim(self) -> Devshim: ...

    def claim(self, name: str) -> None:
        """Make this driver the owner of ``name``, or raise ClaimRefused: another source's, or
        one its settings do not allow. Only an owned resource may be added or removed."""

    async def add_resource(self, name: str, source: DeviceSource) -> None: ...

    async def remove_resource(self, name: str) -> None: ...

    def options_changed(self, name: str) -> None:
        """``name``'s capabilities changed: the kubelet must be told (it caches options per
        registration)."""

    async def ship_cdi_specs(self, specs: Sequence[CdiSpec]) -> None:
        """Write the CDI specs the driver ships for the runtime, replacing its last ones, or
        raise GrantRefused (a device's edits or kind outside the driver's grant policy) or
        OSError: the driver's start then fails with that reason."""


@dataclass
class CallTally:
    """How one method's calls to the driver went: what an operator (and `devshim compat`) reads."""

    ok: int = 0
    failed: int = 0
    last_error: str = ""


class DriverHost:
    def __init__(self, settings: DriverSettings, registry: ResourceRegistry, store: InventoryStore) -> None:
        self.settings = settings
        self.name = settings.name
        self._registry = registry
        self._store = store
        self._policy = settings.restart
        self.sources: dict[str, DriverSource] = {}
        self.status = "not started"
        self.failures = 0  # runs that failed after starting (each one restarted, unless given up)
        self.start_failures = 0  # starts that failed (retried up to max_start_failures in a row)
        self.last_failure = ""
        self.calls: dict[str, CallTally] = {}
        # The resources the driver declared last and may not serve, with why (the first few).
        self.refused: dict[str, str] = {}
        self._run: DriverProcess | None = None
        self._ready = asyncio.Event()
        self.gave_up = asyncio.Event()  # set once the driver stays down for good
        self._supervisor: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._registered: set[str] = set()  # sources handed to the registry (one whose list failed is not)
        # One resource set at a time, in the order the driver sent them: a removal cannot overtake
        # an addition still listing its devices, which would leave a resource served and untracked.
        self._reconciling = asyncio.Lock()
        limits = settings.stderr  # a `log` notification is bounded as a stderr line is
        self._driver_log = DriverLog(limits.max_line_bytes, limits.max_lines_per_s, self._emit_driver_log)

    @property
    def process(self) -> asyncio.subprocess.Process | None:
        return self._run.process if self._run else None

    # --- life cycle --------------------------------------------------------

    async def start(self) -> None:
        """Serve what the last run knew (Unhealthy until the driver confirms), then supervise."""
        for resource in self._store.resources():
            saved = await asyncio.to_thread(self._store.load, resource)  # file I/O: off the loop
            if saved is not None:
                if (why := self._admit(resource)) is not None:
                    logger.warning("driver {!r}: not restoring its saved resource: {}", self.name, why)
                    continue
                # With what the driver last declared: most likely what it declares again, so the
                # kubelet gets the right options at the first registration.
                source = self._source_for(protocol.ResourceInfo(resource, saved.capabilities))
                await source.restore(saved)
                await self._registry.add_resource(resource, source)
                self._registered.add(resource)
        self._supervisor = asyncio.create_task(self._supervise(), name=f"driver:{self.name}")

    async def _supervise(self) -> None:
        quick_failures = 0
        while True:
            try:
                await self._start_with_retries()
            except DriverFailed as exc:
                self.status = f"down: {exc}"
                self.gave_up.set()
                logger.error(
                    "driver {!r} failed to start {} times in a row; it stays down, its devices Unhealthy: {}",
                    self.name, self._policy.max_start_failures, exc,
                )  # fmt: skip
                return
            assert self._run is not None
            up_since = time.monotonic()
            # shield: cancelling the supervisor (devshim stopping) must not cancel the run's
            # failure future, or the run would look failed and never get its shutdown.
            reason = await asyncio.shield(self._run.failed)
            await self._after_failure(reason)
            stable = time.monotonic() - up_since >= self._policy.stable_after_s
            quick_failures = 0 if stable else quick_failures + 1
            await asyncio.sleep(self._backoff(quick_failures))

    def _backoff(self, attempt: int) -> float:
        if attempt == 0:
            return 0.0
        return float(min(self._policy.backoff_max_s, self._policy.backoff_initial_s * 2 ** (attempt - 1)))

    async def _start_with_retries(self) -> None:
        def log_retry(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            delay = state.next_action.sleep if state.next_action else 0
            logger.warning("driver {!r} failed to start ({}); retrying in {:.1f} s", self.name, error, delay)

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(DriverFailed),
            stop=stop_after_attempt(self._policy.max_start_failures),
            wait=wait_exponential(multiplier=self._policy.backoff_initial_s, max=self._policy.backoff_max_s),
            before_sleep=log_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._start_once()

    async def _start_once(self) -> None:
        self.status = "starting"
        run = DriverProcess(self.settings, self._notification_handlers(), self._list_refusal)
        self._run = run
        try:
            await run.start()
            result = await run.request(
                "initialize", self._initialize_params(), self.settings.timeouts.initialize_s
            )
            initialized = protocol.initialize_result_from_json(result)
            # Before any resource is served: a grant naming a shipped device resolves at once.
            await self._registry.ship_cdi_specs(initialized.cdi_specs)
            self._ready.set()  # list_devices goes through call(), like every later request
            await self._reconcile(initialized.resources)
        except Exception as exc:
            self._ready.clear()
            reason = run.failed.result() if run.failed.done() else str(exc)
            self.start_failures += 1
            self.last_failure = reason
            await run.stop(graceful=False)
            raise DriverFailed(reason) from None
        self.status = "up"
        logger.info("driver {!r}: serving {}", self.name, ", ".join(self.sources) or "no resources")

    def _initialize_params(self) -> dict[str, Any]:
        # What devshim knows to be in use, so a restarted driver can rebuild its state.
        in_use = [(name, group) for name, source in self.sources.items() for group in source.in_use]
        return protocol.initialize_params(__version__, in_use)

    async def _after_failure(self, reason: str) -> None:
        self._ready.clear()
        self.failures += 1
        metrics.driver_restarted(self.name)
        self.last_failure = reason
        self.status = f"restarting: {reason}"
        logger.error("driver {!r} failed: {}; its devices are Unhealthy until it is back", self.name, reason)
        for source in self.sources.values():
            await source.outage()
        if self._run is not None:
            await self._run.stop(graceful=False)

    async def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
        if self._run is not None:
            await self._run.stop(graceful=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for source in self.sources.values():
            await source.close()

    # --- resources ---------------------------------------------------------

    @property
    def device_count(self) -> int:
        """The devices this driver's resources hold now (Unhealthy ones through an outage too)."""
        return sum(source.device_count for source in self.sources.values())

    def _list_refusal(self, method: str, message: Any, resource: Any) -> str | None:
        """Why the run must fail rather than this device list be taken, or None: checked by the
        list's length before any device of it is read (driverhost/limits.py). A list replaces its
        resource's, so that one's devices are not counted twice."""
        if (refusal := over_one_list(method, message, resource)) is not None:
            return refusal
        source = self.sources.get(resource) if isinstance(resource, str) else None
        listed = limits.listed_devices(message)
        if source is None or listed is None:
            return None  # not a list of a resource it serves: the handler or the reader says so
        others = self.device_count - source.device_count
        if others + listed > self.settings.max_devices:
            why = f"the driver's other resources hold {others:,}"
            setting = f"drivers[{self.name}].max_devices"
            refusal = limits.total_refusal(method, resource, listed, why, self.settings.max_devices, setting)
            return f"its list was refused: {refusal}"
        shim = self._registry.shim
        static = static_device_count(shim.settings.resources)
        others += static + sum(host.device_count for host in shim.drivers if host is not self)
        if others + listed > shim.settings.max_devices:
            why = f"devshim's other resources (of every driver and the static ones) hold {others:,}"
            refusal = limits.total_refusal(
                method, resource, listed, why, shim.settings.max_devices, "max_devices"
            )
            return f"its list was refused: {refusal}"
        return None

    def _source_for(self, info: protocol.ResourceInfo) -> DriverSource:
        source = self.sources.get(info.name)
        if source is None:
            source = DriverSource(info, self.call, self._store, self._policy.call_wait_s)
            self.sources[info.name] = source
        else:
            changed = source.info.capabilities != info.capabilities
            source.info = info
            # Restored with none, then declared; or a restarted driver declaring others: the
            # kubelet acts on what the registration said until it is registered again.
            if changed and info.name in self._registered:
                logger.info(
                    "driver {!r}: {} now declares {}", self.name, info.name, _declared(info.capabilities)
                )
                self._registry.options_changed(info.name)
        return source

    def _admit(self, name: str) -> str | None:
        """Claim ``name`` for this driver: None, or why it may not serve it (counted, not logged).

        A driver's names are checked like configured ones before any socket, file or glob is made
        from them; ownership is the registry's (docs/driver-protocol.md, "Which resources a driver
        serves")."""
        try:
            check_extended_resource_name(name)
        except ValueError as exc:
            metrics.driver_claim_refused(self.name, "invalid")
            return _cut(str(exc))
        try:
            self._registry.claim(name)
        except ClaimRefused as exc:
            # Label a name someone owns (a bounded set); never one the driver made up.
            metrics.driver_claim_refused(self.name, name if exc.holder else "other")
            return _cut(str(exc))
        return None

    async def _reconcile(self, resources: list[protocol.ResourceInfo]) -> None:
        """Make the served resources those the driver declares now, less the ones it may not
        serve (each refused with a warning, the rest applied); list each one's devices."""
        async with self._reconciling:
            wanted = {r.name: r for r in resources}
            # Only its own: nothing else is ever in self.sources.
            for name in [n for n in self.sources if n not in wanted]:
                del self.sources[name]
                self._registered.discard(name)
                await self._registry.remove_resource(name)
                self._store.forget(name)  # after: closing the source saves its devices once more
            refused = 0
            self.refused = {}
            for info in wanted.values():
                if info.name not in self.sources and (why := self._admit(info.name)) is not None:
                    refused += 1
                    if refused <= _REFUSALS_LOGGED:
                        logger.warning("driver {!r}: refused a resource it may not serve: {}", self.name, why)
                        self.refused[_cut(info.name)] = why
                    continue
                source = self._source_for(info)
                await source.refresh()
                if info.name not in self._registered:
                    await self._registry.add_resource(info.name, source)
                    self._registered.add(info.name)
            if refused > _REFUSALS_LOGGED:
                logger.warning(
                    "driver {!r}: {} more resources refused", self.name, refused - _REFUSALS_LOGGED
                )

    # --- calls -------------------------------------------------------------

    async def call(self, method: str, params: Any, parse: Callable[[Any], Any] = _as_is) -> Any:
        """One request to the driver, its answer read by ``parse``; a failure, or an answer
        ``parse`` refuses, mapped to what the kubelet should see, naming driver and method."""
        tally = self.calls.setdefault(method, CallTally())
        try:
            result = await self._call(method, params, parse)
        except ShimError as exc:
            tally.failed += 1
            metrics.driver_call(self.name, method, ok=False)
            tally.last_error = str(exc)
            raise
        tally.ok += 1
        metrics.driver_call(self.name, method, ok=True)
        return result

    async def _call(self, method: str, params: Any, parse: Callable[[Any], Any]) -> Any:
        if not self._ready.is_set():
            await self._wait_until_back(method)
        run = self._run
        assert run is not None
        timeout = getattr(self.settings.timeouts, f"{method}_s")
        try:
            return parse(await run.request(method, params, timeout, hang_is_failure=method not in ADVISORY))
        except Exception as exc:
            raise protocol.error_for(self.name, method, exc) from None

    async def _wait_until_back(self, method: str) -> None:
        restarting = method in WAIT_FOR_RESTART and not self.gave_up.is_set()
        wait_s = self._policy.call_wait_s if restarting else 0
        try:
            async with asyncio.timeout(wait_s):
                await self._ready.wait()
        except TimeoutError:
            raise SourceUnavailable(
                f"driver {self.name!r}: {method}: the driver is not running ({self.status})"
                + (f"; waited {wait_s:g} s for it" if wait_s else "")
            ) from None

    # --- notifications -------------------------------------------------------

    def _notification_handlers(self) -> dict[str, Any]:
        return {
            "devices_changed": self._on_devices_changed,
            "health_changed": self._on_health_changed,
            "resources_changed": self._on_resources_changed,
            "log": self._on_log,
        }

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _notified_source(self, params: Any) -> DriverSource | None:
        name = protocol.field(params, "resource")
        source = self.sources.get(name) if isinstance(name, str) else None
        if source is None:
            logger.warning("driver {!r}: notification for unknown resource {}", self.name, _cut(repr(name)))
        return source

    # Each is taken at once, as counted (_list_refusal) and in the order sent; only telling the
    # followers waits.
    def _on_devices_changed(self, params: Any) -> None:
        if source := self._notified_source(params):
            source.take_devices(source.devices_from_json(params))
            self._spawn(source.publish())

    def _on_health_changed(self, params: Any) -> None:
        if source := self._notified_source(params):
            source.take_health(protocol.health_changes_from_json(params))
            self._spawn(source.publish())

    def _on_resources_changed(self, params: Any) -> None:
        self._spawn(self._reconcile_logged(protocol.resources_from_json(params)))

    async def _reconcile_logged(self, resources: list[protocol.ResourceInfo]) -> None:
        try:
            await self._reconcile(resources)
        except ShimError as exc:
            logger.error("driver {!r}: cannot apply its new resources: {}", self.name, exc)

    def _on_log(self, params: Any) -> None:
        """A `log` notification: one line, escaped, cut and rate-limited as stderr is."""
        level, message = protocol.log_from_json(params)
        loop = asyncio.get_running_loop()
        self._driver_log.log(level, message, loop.time())
        if (end := self._driver_log.summary_due()) is not None:
            loop.call_at(end, self._driver_log.end_window, end)

    def _emit_driver_log(self, level: str, text: str) -> None:
        logger.log(level, "driver {!r}: {}", self.name, text)


def _declared(capabilities: Capabilities) -> str:
    named = [f.name for f in dataclasses.fields(capabilities) if getattr(capabilities, f.name)]
    return ", ".join(named) or "no optional calls"


def _cut(text: str) -> str:
    if len(text) <= _SHOWN_CHARS:
        return text
    return f"{text[:_SHOWN_CHARS]}... ({len(text) - _SHOWN_CHARS:,} more characters)"

"""The endpoint's decisions, kept apart from its I/O: what each signal means, and what comes next.

The endpoint (cycle.py) serves, registers and watches; it tells this machine what it saw (the
methods below, events in) and carries out what the machine answers (``Action`` values out). No
asyncio, gRPC or file system here, so every decision is checked by one table
(tests/unit/test_endpoint_machine.py), state by event.

Phases, for every registration path:

    IDLE --served--> SERVING --registered--> REGISTERED
      ^                 |                        |
      +--- a restart: our socket gone, kubelet.sock new, the kubelet's stream ended,
      |    the watcher refused (then a pause first), a serving attempt failed,
      |    the resource's options changed (the kubelet reads them once per registration)
      +--- successor_gone <-- HANDED_OVER <-- another instance asked (any phase)
      +--- list_changed  <-- LIST_REFUSED <-- devshim ended a stream: a list it cannot send

Paths differ only in who says "registered": classic, the kubelet's answer to our Register
(``registered``); watcher, the plugin watcher's status (``watcher_said``). Handover is an option
of either. A new path (DRA's, next) is a local change: a ``Registration`` value, the events that say
it is registered or refused, and its rows in the table test.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

from shim.deviceplugin.api import ListRefused
from shim.node.sockets import FileIdentity

# What made the endpoint register again (the metric's label, ops/metrics.py RestartReason).
Cause = Literal["socket_removed", "kubelet_socket_recreated", "stream_ended", "watcher_refused"]


_NONE_COUNTED = object()  # no kubelet restart counted yet


class Registration(enum.Enum):
    CLASSIC = "classic"  # Register on kubelet.sock
    WATCHER = "watcher"  # a registration socket in plugins_registry, found by the plugin watcher


class Phase(enum.Enum):
    IDLE = "idle"  # nothing published: before the first serve, or a restart under way
    SERVING = "serving"  # our socket is published; classic: Register under way (retried)
    REGISTERED = "registered"  # the kubelet has taken the registration
    HANDED_OVER = "handed over"  # another instance took over: closed until it is gone
    LIST_REFUSED = "list refused"  # a list devshim cannot send: not registered until it changes


class Step(enum.Enum):
    """What the cycle does next (``Machine.next_step``)."""

    SERVE = "serve"
    PAUSE_THEN_SERVE = "pause, then serve"
    AWAIT_SUCCESSOR_GONE = "close, and wait until the successor is gone"
    AWAIT_ANOTHER_LIST = "wait until the list changes"
    AWAIT_SIGNAL = "serve on until a signal"


@dataclass(frozen=True)
class Restart:
    """Serve and register again (logged with the reason; counted by cause unless ``counted`` is
    False: a second signal of a kubelet restart already counted)."""

    cause: Cause
    reason: str
    counted: bool = True


@dataclass(frozen=True)
class Reregister:
    """Serve and register again on devshim's own account, not the kubelet's (not counted as a
    kubelet restart)."""

    reason: str


@dataclass(frozen=True)
class LetGo:
    """Another instance asked for the resource: close, and wait until it is gone."""


@dataclass(frozen=True)
class AwaitList:
    """Not registered until the list changes: registering again would fail the same way."""

    refused: ListRefused


@dataclass(frozen=True)
class KubeletSeen:
    """kubelet.sock appeared (or changed) while registering: try at once, not after the backoff."""


@dataclass(frozen=True)
class ServeOn:
    """The kubelet ended its stream in watcher mode: it finds our socket again by itself."""


@dataclass(frozen=True)
class Registered:
    """The registration was taken (``version`` empty: the watcher does not say which)."""

    version: str


@dataclass(frozen=True)
class Refused:
    """The registration was refused; the error is in ``Machine.last_error``."""

    version: str


Action = Restart | Reregister | LetGo | AwaitList | KubeletSeen | ServeOn | Registered | Refused
# The actions after which the cycle must look at next_step again.
WAKES = (Restart, Reregister, LetGo, AwaitList)


class Machine:
    """One endpoint's state and decisions; see the module docstring."""

    def __init__(self, registration: Registration, handover: bool) -> None:
        self.registration = registration
        self.handover = handover
        self.phase = Phase.IDLE
        self.socket: FileIdentity | None = None  # our published socket, as the cycle saw it
        self.registered_with: FileIdentity | None = None  # kubelet.sock when Register succeeded
        self.attempted_with: FileIdentity | None = None  # kubelet.sock at the last attempt
        self.refused: ListRefused | None = None
        self.pause = False  # before serving again: the watcher acts only on new sockets
        # The kubelet.sock whose restart was counted last: one kubelet restart often gives two
        # signals (its stream ends, then its new kubelet.sock appears, or its start-up cleanup
        # removes the socket served meanwhile), and is counted once.
        self.counted_kubelet: FileIdentity | None | object = _NONE_COUNTED
        # What status shows.
        self.negotiated = ""
        self.registrations = 0
        self.watcher_status = ""
        self.last_error = ""

    @property
    def registered(self) -> bool:
        return self.phase is Phase.REGISTERED

    # --- what the cycle does, and what it reports ---------------------------------------------

    def next_step(self) -> Step:
        if self.phase is Phase.HANDED_OVER:
            return Step.AWAIT_SUCCESSOR_GONE
        if self.phase is Phase.LIST_REFUSED:
            return Step.AWAIT_ANOTHER_LIST
        if self.phase is not Phase.IDLE:
            return Step.AWAIT_SIGNAL
        if self.pause:
            self.pause = False
            return Step.PAUSE_THEN_SERVE
        return Step.SERVE

    def served(self, socket: FileIdentity) -> None:
        """A fresh server's socket is published."""
        self.socket = socket
        if self.phase is Phase.IDLE:  # unless a signal moved on meanwhile (a handover)
            self.phase = Phase.SERVING
            self.registered_with = None
            if self.registration is Registration.WATCHER:
                self.watcher_status = "waiting for the plugin watcher"

    def serving_ended(self) -> None:
        """That serving attempt is over (its socket gone, it failed, or a signal cut it short)."""
        if self.phase in (Phase.SERVING, Phase.REGISTERED):
            self.phase = Phase.IDLE
        self.registered_with = None

    def closed(self) -> None:
        self.socket = None

    def attempting(self, kubelet: FileIdentity | None) -> None:
        self.attempted_with = kubelet

    def register_answered(self, kubelet: FileIdentity, version: str) -> list[Action]:
        """The kubelet took our Register (classic)."""
        if self.phase is not Phase.SERVING:
            return []  # a signal came first: this cycle is over anyway
        self.phase = Phase.REGISTERED
        self.registered_with = kubelet
        self.negotiated = version
        self.registrations += 1
        self.last_error = ""
        return [Registered(version)]

    def register_failed(self, version: str, error: str) -> list[Action]:
        """One Register attempt failed (retried by the cycle)."""
        self.last_error = error
        return [Refused(version)]

    def successor_gone(self) -> None:
        if self.phase is Phase.HANDED_OVER:
            self.phase = Phase.IDLE

    def list_changed(self) -> None:
        if self.phase is Phase.LIST_REFUSED:
            self.phase = Phase.IDLE
            self.refused = None

    # --- signals ------------------------------------------------------------------------------

    def files_changed(
        self, *, handover_asked: bool, ours: FileIdentity | None, kubelet: FileIdentity | None
    ) -> list[Action]:
        """The directories changed; the cycle looked: is another instance asking for the
        resource, and what are our socket and kubelet.sock now (None: absent)?"""
        if handover_asked and self.handover and self.phase is not Phase.HANDED_OVER:
            self.phase = Phase.HANDED_OVER
            return [LetGo()]
        if self.phase not in (Phase.SERVING, Phase.REGISTERED):
            return []  # nothing of ours is published, or we wait for something else
        if ours != self.socket:
            return self._restart("socket_removed", "our socket was deleted or replaced")
        if self.registration is Registration.WATCHER or kubelet is None:
            return []
        if self.phase is Phase.REGISTERED and kubelet != self.registered_with:
            return self._restart("kubelet_socket_recreated", "kubelet.sock was re-created")
        return [KubeletSeen()] if kubelet != self.attempted_with else []

    def stream_ended(self, refused: ListRefused | None) -> list[Action]:
        """A ListAndWatch stream ended: the kubelet ended it (None), or devshim did, over a list
        it cannot send."""
        if refused is not None:
            if self.phase is Phase.HANDED_OVER:
                return []
            self.refused = refused
            self.last_error = refused.reason
            if self.registration is Registration.WATCHER:
                self.watcher_status = "device list not sent to the kubelet"  # last_error says why
            if self.phase is Phase.LIST_REFUSED:
                return []  # already waiting for another list
            self.phase = Phase.LIST_REFUSED
            return [AwaitList(refused)]
        if self.phase not in (Phase.SERVING, Phase.REGISTERED):
            return []
        if self.registration is Registration.WATCHER:
            return [ServeOn()]
        if self.phase is Phase.REGISTERED:
            return self._restart("stream_ended", "the kubelet ended ListAndWatch")
        return []

    def options_changed(self) -> list[Action]:
        """The resource's options (prestart, preferred allocation, ...) changed: a kubelet reads
        them once per registration (1.25+: GetDevicePluginOptions as it connects; before: from
        the Register), so it acts on the old ones until registered again. Idle, or waiting for
        another list or a successor, the next registration carries the new ones anyway."""
        if self.phase not in (Phase.SERVING, Phase.REGISTERED):
            return []
        self.phase = Phase.IDLE
        self.registered_with = None
        return [Reregister("its options changed, which the kubelet reads once per registration")]

    def watcher_said(self, registered: bool, error: str) -> list[Action]:
        """The plugin watcher's NotifyRegistrationStatus."""
        if self.phase not in (Phase.SERVING, Phase.REGISTERED):
            # An old server's late word: counted, but the cycle has moved on.
            return [Registered("") if registered else Refused("")]
        if registered:
            self.phase = Phase.REGISTERED
            self.watcher_status = "registered"
            self.registrations += 1
            self.last_error = ""
            return [Registered("")]
        self.watcher_status = f"refused: {error}"
        self.pause = True
        return [Refused(""), *self._restart("watcher_refused", f"the plugin watcher refused it ({error})")]

    def _restart(self, cause: Cause, reason: str) -> list[Action]:
        # The kubelet this endpoint was registered with, or last tried: counted once as restarted.
        kubelet = self.registered_with or self.attempted_with
        counted = cause == "watcher_refused" or kubelet != self.counted_kubelet
        if counted and cause != "watcher_refused":
            self.counted_kubelet = kubelet
        self.phase = Phase.IDLE
        self.registered_with = None
        return [Restart(cause, reason, counted)]

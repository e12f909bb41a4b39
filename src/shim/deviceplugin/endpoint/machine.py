"""The endpoint's decisions, kept apart from its I/O: what each signal means, and what comes next.

The endpoint (cycle.py) serves, registers and watches; it tells this machine what it saw (the
methods below) and carries out what the machine answers (``Action`` values out). No asyncio, gRPC
or file system here.

What each event does in each phase is data, ``TRANSITIONS`` (as in h11's _state.py): the methods
only say which ``Event`` a report is, record its facts, and do what the table's row says; an event
no row names in a phase changes nothing. tests/unit/test_endpoint_machine.py runs every report in
every phase against this table: the one statement of each event's actions and next phase.

Phases, for every registration path:

    IDLE --served--> SERVING --registered--> REGISTERED
      ^                 |                        |
      +--- a restart: our socket gone, kubelet.sock new, the kubelet's stream ended,
      |    the watcher refused (then a pause first), a serving attempt failed,
      |    the resource's options changed (the kubelet reads them once per registration)
      +--- successor_gone <-- HANDED_OVER <-- another instance asked (any phase)
      +--- list_changed  <-- LIST_REFUSED <-- devshim ended a stream: a list it cannot send

Paths differ in who says "registered": classic, the kubelet's answer to our Register
(``register_answered``); watcher, the plugin watcher's status (``watcher_said``); and in what the
kubelet's ending a stream means. Handover is an option of either. A new path (DRA's, next) is a
local change: a ``Registration`` value, the events that say it is registered or refused, and its
table in ``TRANSITIONS``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
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


class Event(enum.Enum):
    """A report as the table knows it (each method below says which it is)."""

    SERVED = "served"  # a fresh server's socket is published
    SERVING_ENDED = "serving ended"  # that serving attempt is over
    REGISTER_ANSWERED = "register answered"  # the kubelet took our Register (classic)
    REGISTER_FAILED = "register failed"  # one Register attempt failed (the cycle retries)
    SUCCESSOR_GONE = "successor gone"
    LIST_CHANGED = "list changed"
    HANDOVER_ASKED = "handover asked"  # by another instance, of an endpoint that hands over
    SOCKET_GONE = "socket gone"  # ours deleted or replaced
    KUBELET_RECREATED = "kubelet.sock re-created"  # registered, and not with this kubelet.sock
    KUBELET_SEEN = "kubelet.sock seen"  # not the one the last Register attempt found
    STREAM_ENDED = "stream ended"  # the kubelet ended a ListAndWatch stream
    LIST_REFUSED = "list refused"  # devshim ended a stream: a list it cannot send
    WATCHER_REGISTERED = "watcher registered"
    WATCHER_REFUSED = "watcher refused"
    OPTIONS_CHANGED = "options changed"


# A row: the phase after, and what the cycle is asked to do, in this order.
Transition = tuple[Phase, tuple[type[Action], ...]]

# What both paths do alike.
_EITHER_PATH: dict[tuple[Phase, Event], Transition] = {
    (Phase.IDLE, Event.SERVED): (Phase.SERVING, ()),
    (Phase.SERVING, Event.SERVING_ENDED): (Phase.IDLE, ()),
    (Phase.REGISTERED, Event.SERVING_ENDED): (Phase.IDLE, ()),
    (Phase.SERVING, Event.REGISTER_ANSWERED): (Phase.REGISTERED, (Registered,)),
    # Counted whatever the phase; the cycle retries.
    (Phase.IDLE, Event.REGISTER_FAILED): (Phase.IDLE, (Refused,)),
    (Phase.SERVING, Event.REGISTER_FAILED): (Phase.SERVING, (Refused,)),
    (Phase.REGISTERED, Event.REGISTER_FAILED): (Phase.REGISTERED, (Refused,)),
    (Phase.HANDED_OVER, Event.REGISTER_FAILED): (Phase.HANDED_OVER, (Refused,)),
    (Phase.LIST_REFUSED, Event.REGISTER_FAILED): (Phase.LIST_REFUSED, (Refused,)),
    (Phase.HANDED_OVER, Event.SUCCESSOR_GONE): (Phase.IDLE, ()),
    (Phase.LIST_REFUSED, Event.LIST_CHANGED): (Phase.IDLE, ()),
    # Let go from any phase (handed over already: nothing new).
    (Phase.IDLE, Event.HANDOVER_ASKED): (Phase.HANDED_OVER, (LetGo,)),
    (Phase.SERVING, Event.HANDOVER_ASKED): (Phase.HANDED_OVER, (LetGo,)),
    (Phase.REGISTERED, Event.HANDOVER_ASKED): (Phase.HANDED_OVER, (LetGo,)),
    (Phase.LIST_REFUSED, Event.HANDOVER_ASKED): (Phase.HANDED_OVER, (LetGo,)),
    # Only while ours is published: before the first serve, or once closed, its absence is no signal.
    (Phase.SERVING, Event.SOCKET_GONE): (Phase.IDLE, (Restart,)),
    (Phase.REGISTERED, Event.SOCKET_GONE): (Phase.IDLE, (Restart,)),
    # Registering again would fail the same way: wait for another list (handed over: its
    # successor's business).
    (Phase.IDLE, Event.LIST_REFUSED): (Phase.LIST_REFUSED, (AwaitList,)),
    (Phase.SERVING, Event.LIST_REFUSED): (Phase.LIST_REFUSED, (AwaitList,)),
    (Phase.REGISTERED, Event.LIST_REFUSED): (Phase.LIST_REFUSED, (AwaitList,)),
    (Phase.LIST_REFUSED, Event.LIST_REFUSED): (Phase.LIST_REFUSED, ()),  # waiting already
    # The watcher's word on the server now published moves on; an old server's late word is
    # only counted, as the cycle has moved on.
    (Phase.SERVING, Event.WATCHER_REGISTERED): (Phase.REGISTERED, (Registered,)),
    (Phase.REGISTERED, Event.WATCHER_REGISTERED): (Phase.REGISTERED, (Registered,)),
    (Phase.IDLE, Event.WATCHER_REGISTERED): (Phase.IDLE, (Registered,)),
    (Phase.HANDED_OVER, Event.WATCHER_REGISTERED): (Phase.HANDED_OVER, (Registered,)),
    (Phase.LIST_REFUSED, Event.WATCHER_REGISTERED): (Phase.LIST_REFUSED, (Registered,)),
    # Refused: a fresh socket, after a pause, since the watcher acts only on new sockets.
    (Phase.SERVING, Event.WATCHER_REFUSED): (Phase.IDLE, (Refused, Restart)),
    (Phase.REGISTERED, Event.WATCHER_REFUSED): (Phase.IDLE, (Refused, Restart)),
    (Phase.IDLE, Event.WATCHER_REFUSED): (Phase.IDLE, (Refused,)),
    (Phase.HANDED_OVER, Event.WATCHER_REFUSED): (Phase.HANDED_OVER, (Refused,)),
    (Phase.LIST_REFUSED, Event.WATCHER_REFUSED): (Phase.LIST_REFUSED, (Refused,)),
    # The kubelet read the options at this registration: only a new one gives it the new ones.
    # Otherwise the next registration carries them anyway.
    (Phase.SERVING, Event.OPTIONS_CHANGED): (Phase.IDLE, (Reregister,)),
    (Phase.REGISTERED, Event.OPTIONS_CHANGED): (Phase.IDLE, (Reregister,)),
}

# (phase, event) -> (phase after, actions), per registration path: what every event does.
TRANSITIONS: Mapping[Registration, Mapping[tuple[Phase, Event], Transition]] = {
    Registration.CLASSIC: {
        **_EITHER_PATH,
        # A new kubelet forgot a registration; otherwise a kubelet.sock the last attempt did not
        # find wakes a Register backing off.
        (Phase.REGISTERED, Event.KUBELET_RECREATED): (Phase.IDLE, (Restart,)),
        (Phase.SERVING, Event.KUBELET_SEEN): (Phase.SERVING, (KubeletSeen,)),
        (Phase.REGISTERED, Event.KUBELET_SEEN): (Phase.REGISTERED, (KubeletSeen,)),
        # The kubelet restarted; before a registration, the Register under way decides.
        (Phase.REGISTERED, Event.STREAM_ENDED): (Phase.IDLE, (Restart,)),
    },
    Registration.WATCHER: {
        **_EITHER_PATH,
        # The watcher finds our socket again by itself (and kubelet.sock is not its signal).
        (Phase.SERVING, Event.STREAM_ENDED): (Phase.SERVING, (ServeOn,)),
        (Phase.REGISTERED, Event.STREAM_ENDED): (Phase.REGISTERED, (ServeOn,)),
    },
}

# Each event whose rows restart: the metric's cause, and the log's reason.
RESTARTS: Mapping[Event, tuple[Cause, str]] = {
    Event.SOCKET_GONE: ("socket_removed", "our socket was deleted or replaced"),
    Event.KUBELET_RECREATED: ("kubelet_socket_recreated", "kubelet.sock was re-created"),
    Event.STREAM_ENDED: ("stream_ended", "the kubelet ended ListAndWatch"),
    Event.WATCHER_REFUSED: ("watcher_refused", "the plugin watcher refused it ({error})"),
}


class Machine:
    """One endpoint's state and decisions; see the module docstring."""

    def __init__(self, registration: Registration, handover: bool) -> None:
        self.registration = registration
        self.handover = handover
        self.phase = Phase.IDLE
        self.socket: FileIdentity | None = None  # our published socket, as the cycle saw it
        # kubelet.sock when Register succeeded; None whenever not registered.
        self.registered_with: FileIdentity | None = None
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
        """A fresh server's socket is published (a signal may have moved on meanwhile: a handover)."""
        self.socket = socket
        if self._fire(Event.SERVED) is not None and self.registration is Registration.WATCHER:
            self.watcher_status = "waiting for the plugin watcher"

    def serving_ended(self) -> None:
        """That serving attempt is over (its socket gone, it failed, or a signal cut it short)."""
        self._fire(Event.SERVING_ENDED)

    # Facts recorded, not events: they change no phase, only what later reports are taken for.

    def closed(self) -> None:
        self.socket = None

    def attempting(self, kubelet: FileIdentity | None) -> None:
        self.attempted_with = kubelet

    def register_answered(self, kubelet: FileIdentity, version: str) -> list[Action]:
        """The kubelet took our Register (classic)."""
        actions = self._fire(Event.REGISTER_ANSWERED, Registered(version))
        if actions is None:
            return []  # a signal came first: this cycle is over anyway
        self.registered_with = kubelet
        self.negotiated = version
        self.registrations += 1
        self.last_error = ""
        return actions

    def register_failed(self, version: str, error: str) -> list[Action]:
        """One Register attempt failed (retried by the cycle)."""
        actions = self._fire(Event.REGISTER_FAILED, Refused(version))
        if actions is None:
            return []
        self.last_error = error
        return actions

    def successor_gone(self) -> None:
        self._fire(Event.SUCCESSOR_GONE)

    def list_changed(self) -> None:
        if self._fire(Event.LIST_CHANGED) is not None:
            self.refused = None

    # --- signals ------------------------------------------------------------------------------

    def files_changed(
        self, *, handover_asked: bool, ours: FileIdentity | None, kubelet: FileIdentity | None
    ) -> list[Action]:
        """The directories changed; the cycle looked: is another instance asking for the
        resource, and what are our socket and kubelet.sock now (None: absent)?"""
        if handover_asked and self.handover:
            event = Event.HANDOVER_ASKED
        elif ours != self.socket:
            event = Event.SOCKET_GONE
        elif kubelet is None:
            return []  # gone, not new: the kubelet is down, and its new socket will say so
        elif self.registered and kubelet != self.registered_with:
            event = Event.KUBELET_RECREATED
        elif kubelet != self.attempted_with:
            event = Event.KUBELET_SEEN
        else:
            return []
        return self._fire(event, LetGo(), KubeletSeen()) or []

    def stream_ended(self, refused: ListRefused | None) -> list[Action]:
        """A ListAndWatch stream ended: the kubelet ended it (None), or devshim did, over a list
        it cannot send."""
        if refused is None:
            return self._fire(Event.STREAM_ENDED, ServeOn()) or []
        actions = self._fire(Event.LIST_REFUSED, AwaitList(refused))
        if actions is None:
            return []
        self.refused = refused
        self.last_error = refused.reason
        if self.registration is Registration.WATCHER:
            self.watcher_status = "device list not sent to the kubelet"  # last_error says why
        return actions

    def options_changed(self) -> list[Action]:
        """The resource's options (prestart, preferred allocation, ...) changed: a kubelet reads
        them once per registration (1.25+: GetDevicePluginOptions as it connects; before: from
        the Register), so it acts on the old ones until registered again."""
        why = "its options changed, which the kubelet reads once per registration"
        return self._fire(Event.OPTIONS_CHANGED, Reregister(why)) or []

    def watcher_said(self, registered: bool, error: str) -> list[Action]:
        """The plugin watcher's NotifyRegistrationStatus."""
        if registered:
            actions = self._fire(Event.WATCHER_REGISTERED, Registered(""))
            if actions is not None and self.registered:  # the server published now: not a late word
                self.watcher_status = "registered"
                self.registrations += 1
                self.last_error = ""
            return actions or []
        actions = self._fire(Event.WATCHER_REFUSED, Refused(""), error=error) or []
        if any(isinstance(action, Restart) for action in actions):  # not a late word
            self.watcher_status = f"refused: {error}"
            self.pause = True
        return actions

    def _fire(self, event: Event, *offered: Action, error: str = "") -> list[Action] | None:
        """Take ``event`` as this path's table says: its row's actions, from those offered (a
        Restart from ``RESTARTS``, counted here), then its phase. None: no row, so nothing
        changes, and the caller records nothing either."""
        row = TRANSITIONS[self.registration].get((self.phase, event))
        if row is None:
            return None
        phase, kinds = row
        actions = [
            self._restart(event, error) if kind is Restart else next(a for a in offered if type(a) is kind)
            for kind in kinds
        ]
        self.phase = phase
        if phase is not Phase.REGISTERED:
            self.registered_with = None
        return actions

    def _restart(self, event: Event, error: str) -> Restart:
        cause, reason = RESTARTS[event]
        # The kubelet this endpoint was registered with, or last tried: counted once as restarted.
        kubelet = self.registered_with or self.attempted_with
        counted = cause == "watcher_refused" or kubelet != self.counted_kubelet
        if counted and cause != "watcher_refused":
            self.counted_kubelet = kubelet
        return Restart(cause, reason.format(error=error), counted)

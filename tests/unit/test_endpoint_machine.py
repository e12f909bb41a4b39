"""The endpoint's decisions (shim/deviceplugin/endpoint/machine.py), state by event.

Every combination of registration path, handover option, phase and event is checked against
TABLE below: a combination no row names must change nothing and ask for nothing. A row that
matches no combination fails too, so the table stays exact as paths are added.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from shim.deviceplugin.api import ListRefused
from shim.deviceplugin.endpoint.machine import (
    Action,
    Machine,
    Phase,
    Registration,
    Restart,
    Step,
)
from shim.model import Device

IDLE, SERVING, REGISTERED = Phase.IDLE, Phase.SERVING, Phase.REGISTERED
HANDED_OVER, LIST_REFUSED = Phase.HANDED_OVER, Phase.LIST_REFUSED
CLASSIC, WATCHER = Registration.CLASSIC, Registration.WATCHER
OURS, OTHER_SOCKET = (1, 10, 100), (1, 11, 101)
KUBELET, NEW_KUBELET = (1, 20, 200), (1, 21, 201)
REFUSED = ListRefused((Device("a"),), "too large for the kubelet")
ANY = None

# Each event as the endpoint reports it, with the facts the machine sees.
EVENTS: dict[str, Callable[[Machine], list[Action] | None]] = {
    "served": lambda m: m.served(OURS),
    "serving ended": lambda m: m.serving_ended(),
    "register answered": lambda m: m.register_answered(KUBELET, "v1beta1"),
    "register failed": lambda m: m.register_failed("v1beta1", "Register (v1beta1): UNAVAILABLE: x"),
    "successor gone": lambda m: m.successor_gone(),
    "list changed": lambda m: m.list_changed(),
    "handover asked": lambda m: m.files_changed(handover_asked=True, ours=OURS, kubelet=KUBELET),
    "socket replaced": lambda m: m.files_changed(handover_asked=False, ours=OTHER_SOCKET, kubelet=KUBELET),
    "socket removed": lambda m: m.files_changed(handover_asked=False, ours=None, kubelet=KUBELET),
    "kubelet.sock new": lambda m: m.files_changed(handover_asked=False, ours=OURS, kubelet=NEW_KUBELET),
    "kubelet.sock gone": lambda m: m.files_changed(handover_asked=False, ours=OURS, kubelet=None),
    "files unchanged": lambda m: m.files_changed(handover_asked=False, ours=OURS, kubelet=KUBELET),
    "kubelet ended stream": lambda m: m.stream_ended(None),
    "list refused": lambda m: m.stream_ended(REFUSED),
    "watcher registered": lambda m: m.watcher_said(True, ""),
    "watcher refused": lambda m: m.watcher_said(False, "bad version"),
    "options changed": lambda m: m.options_changed(),
}

# (event, phases, path, handover) -> (actions, phase after, next step after). ANY matches all.
Row = tuple[str, tuple[Phase, ...], Registration | None, bool | None]
Outcome = tuple[list[str], Phase, Step]
TABLE: dict[Row, Outcome] = {
    ("served", (IDLE,), ANY, ANY): ([], SERVING, Step.AWAIT_SIGNAL),
    ("serving ended", (SERVING, REGISTERED), ANY, ANY): ([], IDLE, Step.SERVE),
    ("register answered", (SERVING,), ANY, ANY): (["Registered"], REGISTERED, Step.AWAIT_SIGNAL),
    # Counted whatever the phase; the cycle retries.
    ("register failed", (SERVING,), ANY, ANY): (["Refused"], SERVING, Step.AWAIT_SIGNAL),
    ("register failed", (REGISTERED,), ANY, ANY): (["Refused"], REGISTERED, Step.AWAIT_SIGNAL),
    ("register failed", (IDLE,), ANY, ANY): (["Refused"], IDLE, Step.SERVE),
    ("register failed", (HANDED_OVER,), ANY, ANY): (["Refused"], HANDED_OVER, Step.AWAIT_SUCCESSOR_GONE),
    ("register failed", (LIST_REFUSED,), ANY, ANY): (["Refused"], LIST_REFUSED, Step.AWAIT_ANOTHER_LIST),
    ("successor gone", (HANDED_OVER,), ANY, ANY): ([], IDLE, Step.SERVE),
    ("list changed", (LIST_REFUSED,), ANY, ANY): ([], IDLE, Step.SERVE),
    # Another instance asks: let go from any phase, if this endpoint hands over at all.
    ("handover asked", (IDLE, SERVING, REGISTERED, LIST_REFUSED), ANY, True): (
        ["LetGo"],
        HANDED_OVER,
        Step.AWAIT_SUCCESSOR_GONE,
    ),
    ("socket replaced", (SERVING, REGISTERED), ANY, ANY): (["Restart:socket_removed"], IDLE, Step.SERVE),
    ("socket removed", (SERVING, REGISTERED), ANY, ANY): (["Restart:socket_removed"], IDLE, Step.SERVE),
    # Classic only: a new kubelet.sock wakes a Register backing off, or ends a registration.
    ("kubelet.sock new", (SERVING,), CLASSIC, ANY): (["KubeletSeen"], SERVING, Step.AWAIT_SIGNAL),
    ("kubelet.sock new", (REGISTERED,), CLASSIC, ANY): (
        ["Restart:kubelet_socket_recreated"],
        IDLE,
        Step.SERVE,
    ),
    ("kubelet ended stream", (REGISTERED,), CLASSIC, ANY): (["Restart:stream_ended"], IDLE, Step.SERVE),
    # The watcher finds our socket again by itself.
    ("kubelet ended stream", (SERVING,), WATCHER, ANY): (["ServeOn"], SERVING, Step.AWAIT_SIGNAL),
    ("kubelet ended stream", (REGISTERED,), WATCHER, ANY): (["ServeOn"], REGISTERED, Step.AWAIT_SIGNAL),
    ("list refused", (IDLE, SERVING, REGISTERED), ANY, ANY): (
        ["AwaitList"],
        LIST_REFUSED,
        Step.AWAIT_ANOTHER_LIST,
    ),
    ("list refused", (LIST_REFUSED,), ANY, ANY): ([], LIST_REFUSED, Step.AWAIT_ANOTHER_LIST),
    ("watcher registered", (SERVING, REGISTERED), ANY, ANY): (["Registered"], REGISTERED, Step.AWAIT_SIGNAL),
    ("watcher registered", (IDLE,), ANY, ANY): (["Registered"], IDLE, Step.SERVE),
    ("watcher registered", (HANDED_OVER,), ANY, ANY): (
        ["Registered"],
        HANDED_OVER,
        Step.AWAIT_SUCCESSOR_GONE,
    ),
    ("watcher registered", (LIST_REFUSED,), ANY, ANY): (
        ["Registered"],
        LIST_REFUSED,
        Step.AWAIT_ANOTHER_LIST,
    ),
    # A fresh socket after a pause: the watcher acts only on new sockets.
    ("watcher refused", (SERVING, REGISTERED), ANY, ANY): (
        ["Refused", "Restart:watcher_refused"],
        IDLE,
        Step.PAUSE_THEN_SERVE,
    ),
    ("watcher refused", (IDLE,), ANY, ANY): (["Refused"], IDLE, Step.SERVE),
    ("watcher refused", (HANDED_OVER,), ANY, ANY): (["Refused"], HANDED_OVER, Step.AWAIT_SUCCESSOR_GONE),
    ("watcher refused", (LIST_REFUSED,), ANY, ANY): (["Refused"], LIST_REFUSED, Step.AWAIT_ANOTHER_LIST),
    # The kubelet read the options at this registration: only a new one gives it the new ones.
    ("options changed", (SERVING, REGISTERED), ANY, ANY): (["Reregister"], IDLE, Step.SERVE),
}
STEP_OF = {
    IDLE: Step.SERVE,
    SERVING: Step.AWAIT_SIGNAL,
    REGISTERED: Step.AWAIT_SIGNAL,
    HANDED_OVER: Step.AWAIT_SUCCESSOR_GONE,
    LIST_REFUSED: Step.AWAIT_ANOTHER_LIST,
}
COMBINATIONS = list(itertools.product(EVENTS, Phase, Registration, (False, True)))


def machine_in(phase: Phase, registration: Registration, handover: bool) -> Machine:
    """A machine in ``phase`` as the cycle leaves it: our socket published, kubelet.sock seen at
    the last Register attempt (and registered with, when registered)."""
    machine = Machine(registration, handover)
    machine.phase, machine.socket, machine.attempted_with = phase, OURS, KUBELET
    if phase is REGISTERED:
        machine.registered_with = KUBELET
    if phase is LIST_REFUSED:
        machine.refused = REFUSED
    return machine


def shown(actions: list[Action] | None) -> list[str]:
    return [f"Restart:{a.cause}" if isinstance(a, Restart) else type(a).__name__ for a in actions or []]


def rows_for(event: str, phase: Phase, registration: Registration, handover: bool) -> list[Row]:
    return [
        row
        for row in TABLE
        if row[0] == event and phase in row[1] and row[2] in (ANY, registration) and row[3] in (ANY, handover)
    ]


@pytest.mark.parametrize(
    ("event", "phase", "registration", "handover"),
    COMBINATIONS,
    ids=[f"{e}-{p.name}-{r.name}-{'handover' if h else 'alone'}" for e, p, r, h in COMBINATIONS],
)
def test_every_event_in_every_state_does_what_the_table_says(
    event: str, phase: Phase, registration: Registration, handover: bool
) -> None:
    rows = rows_for(event, phase, registration, handover)
    assert len(rows) <= 1, f"the table is ambiguous here: {rows}"
    expected = TABLE[rows[0]] if rows else ([], phase, STEP_OF[phase])  # unnamed: ignored
    machine = machine_in(phase, registration, handover)
    actions = shown(EVENTS[event](machine))
    assert (actions, machine.phase, machine.next_step()) == expected


def test_every_row_of_the_table_is_reached() -> None:
    reached = {row for combination in COMBINATIONS for row in rows_for(*combination)}
    assert reached == set(TABLE)


def test_the_pause_after_a_refusal_is_taken_once() -> None:
    machine = machine_in(SERVING, WATCHER, False)
    machine.watcher_said(False, "bad version")
    assert [machine.next_step(), machine.next_step()] == [Step.PAUSE_THEN_SERVE, Step.SERVE]


def test_what_status_shows_follows_the_registration() -> None:
    """registered, the version, the count, the watcher's word and the last error."""
    classic = machine_in(IDLE, CLASSIC, False)
    classic.served(OURS)
    classic.register_failed("v1beta2", "Register (v1beta2): UNAVAILABLE: down")
    assert (classic.registered, classic.last_error) == (False, "Register (v1beta2): UNAVAILABLE: down")
    classic.register_answered(KUBELET, "v1beta1")
    assert (classic.registered, classic.negotiated, classic.registrations, classic.last_error) == (
        True,
        "v1beta1",
        1,
        "",
    )
    classic.stream_ended(REFUSED)
    assert (classic.registered, classic.last_error) == (False, "too large for the kubelet")

    watcher = machine_in(IDLE, WATCHER, False)
    watcher.served(OURS)
    assert (watcher.registered, watcher.watcher_status) == (False, "waiting for the plugin watcher")
    watcher.watcher_said(True, "")
    assert (watcher.registered, watcher.watcher_status, watcher.registrations) == (True, "registered", 1)
    watcher.stream_ended(REFUSED)
    assert watcher.watcher_status == "device list not sent to the kubelet"
    refused = machine_in(SERVING, WATCHER, False)
    refused.watcher_said(False, "bad version")
    assert (refused.registered, refused.watcher_status) == (False, "refused: bad version")


def test_a_serve_finished_after_a_handover_does_not_undo_it() -> None:
    """Asked to let go while a fresh server was starting: publishing it keeps the handover."""
    machine = machine_in(IDLE, CLASSIC, True)
    machine.files_changed(handover_asked=True, ours=None, kubelet=KUBELET)
    machine.served(OURS)
    assert (machine.phase, machine.next_step()) == (HANDED_OVER, Step.AWAIT_SUCCESSOR_GONE)
    assert machine.register_answered(KUBELET, "v1beta1") == [] and not machine.registered


def counted(actions: list[Action]) -> list[tuple[str, bool]]:
    return [(a.cause, a.counted) for a in actions if isinstance(a, Restart)]


def test_one_kubelet_restart_is_counted_once_whatever_signals_it_gives() -> None:
    """Its stream ends (counted), the old kubelet still answers the next Register, then its new
    kubelet.sock appears: the same restart, not counted again. Or, on a kubelet that cleans
    device-plugins/ as it starts, the socket served meanwhile is removed: not counted again. The
    new kubelet's own restart later is counted."""
    machine = Machine(CLASSIC, handover=False)
    machine.served(OURS)
    machine.attempting(KUBELET)
    machine.register_answered(KUBELET, "v1beta1")
    assert counted(machine.stream_ended(None)) == [("stream_ended", True)]
    machine.served(OTHER_SOCKET)
    machine.attempting(KUBELET)
    machine.register_answered(KUBELET, "v1beta1")  # the old kubelet, shutting down, answered
    new = machine.files_changed(handover_asked=False, ours=OTHER_SOCKET, kubelet=NEW_KUBELET)
    assert counted(new) == [("kubelet_socket_recreated", False)]
    machine.served(OURS)
    machine.attempting(NEW_KUBELET)
    machine.register_answered(NEW_KUBELET, "v1beta1")
    assert counted(machine.stream_ended(None)) == [("stream_ended", True)], "the new kubelet's restart"
    machine.served(OTHER_SOCKET)
    machine.attempting(NEW_KUBELET)  # not answered: the kubelet is down
    cleaned = machine.files_changed(handover_asked=False, ours=None, kubelet=(1, 22, 202))
    assert counted(cleaned) == [("socket_removed", False)], "its start-up cleanup: the same restart"

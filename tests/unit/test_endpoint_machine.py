"""The endpoint's decisions (shim/deviceplugin/endpoint/machine.py), state by event.

The machine's table, ``TRANSITIONS``, is the specification: every report the endpoint makes, in
every phase, on either registration path, with and without handover, must do what the table's row
for the event it is says (its actions, a Restart with the event's cause, and its phase); an event
with no row must change nothing and ask for nothing. Every row must be reached, so the reports here
cover the whole table, and a table edit shows up as a changed machine.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from shim.deviceplugin.api import ListRefused
from shim.deviceplugin.endpoint.machine import (
    RESTARTS,
    TRANSITIONS,
    Action,
    Event,
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


def kubelet_back(machine: Machine) -> list[Action]:
    """The last Register attempt found another kubelet.sock; now the one before is back."""
    machine.attempting(NEW_KUBELET)
    return machine.files_changed(handover_asked=False, ours=OURS, kubelet=KUBELET)


# Each report as the endpoint makes it, with the facts the machine sees, and the event it is in a
# machine_in(...) (None: none; what depends on the machine, in taken_as).
Report = Callable[[Machine], list[Action] | None]
REPORTS: dict[str, tuple[Report, Event | None]] = {
    "served": (lambda m: m.served(OURS), Event.SERVED),
    "serving ended": (lambda m: m.serving_ended(), Event.SERVING_ENDED),
    "register answered": (lambda m: m.register_answered(KUBELET, "v1beta1"), Event.REGISTER_ANSWERED),
    "register failed": (
        lambda m: m.register_failed("v1beta1", "Register (v1beta1): UNAVAILABLE: x"),
        Event.REGISTER_FAILED,
    ),
    "successor gone": (lambda m: m.successor_gone(), Event.SUCCESSOR_GONE),
    "list changed": (lambda m: m.list_changed(), Event.LIST_CHANGED),
    "handover asked": (
        lambda m: m.files_changed(handover_asked=True, ours=OURS, kubelet=KUBELET),
        Event.HANDOVER_ASKED,
    ),
    "socket replaced": (
        lambda m: m.files_changed(handover_asked=False, ours=OTHER_SOCKET, kubelet=KUBELET),
        Event.SOCKET_GONE,
    ),
    "socket removed": (
        lambda m: m.files_changed(handover_asked=False, ours=None, kubelet=KUBELET),
        Event.SOCKET_GONE,
    ),
    "kubelet.sock new": (
        lambda m: m.files_changed(handover_asked=False, ours=OURS, kubelet=NEW_KUBELET),
        Event.KUBELET_SEEN,
    ),
    "kubelet.sock back": (kubelet_back, Event.KUBELET_SEEN),
    "kubelet.sock gone": (lambda m: m.files_changed(handover_asked=False, ours=OURS, kubelet=None), None),
    "files unchanged": (lambda m: m.files_changed(handover_asked=False, ours=OURS, kubelet=KUBELET), None),
    "kubelet ended stream": (lambda m: m.stream_ended(None), Event.STREAM_ENDED),
    "list refused": (lambda m: m.stream_ended(REFUSED), Event.LIST_REFUSED),
    "watcher registered": (lambda m: m.watcher_said(True, ""), Event.WATCHER_REGISTERED),
    "watcher refused": (lambda m: m.watcher_said(False, "bad version"), Event.WATCHER_REFUSED),
    "options changed": (lambda m: m.options_changed(), Event.OPTIONS_CHANGED),
}
STEP_OF = {
    IDLE: Step.SERVE,
    SERVING: Step.AWAIT_SIGNAL,
    REGISTERED: Step.AWAIT_SIGNAL,
    HANDED_OVER: Step.AWAIT_SUCCESSOR_GONE,
    LIST_REFUSED: Step.AWAIT_ANOTHER_LIST,
}
COMBINATIONS = list(itertools.product(REPORTS, Phase, Registration, (False, True)))


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


def taken_as(report: str, phase: Phase, handover: bool) -> Event | None:
    """The event ``report`` is to machine_in(phase, ..., handover)."""
    if report == "handover asked" and not handover:
        return None  # this endpoint does not hand over, and its files are as they were
    if report == "kubelet.sock new" and phase is REGISTERED:
        return Event.KUBELET_RECREATED  # not the kubelet.sock it registered with
    return REPORTS[report][1]


def expected(
    report: str, phase: Phase, registration: Registration, handover: bool
) -> tuple[list[str], Phase, Step]:
    """What the table says: the actions (shown as ``shown`` shows them), the phase and step after."""
    event = taken_as(report, phase, handover)
    row = None if event is None else TRANSITIONS[registration].get((phase, event))
    if event is None or row is None:
        return [], phase, STEP_OF[phase]
    after, kinds = row
    actions = [f"Restart:{RESTARTS[event][0]}" if kind is Restart else kind.__name__ for kind in kinds]
    # The watcher acts only on new sockets: after its refusal, a pause before the fresh one.
    step = Step.PAUSE_THEN_SERVE if "Restart:watcher_refused" in actions else STEP_OF[after]
    return actions, after, step


def shown(actions: list[Action] | None) -> list[str]:
    return [f"Restart:{a.cause}" if isinstance(a, Restart) else type(a).__name__ for a in actions or []]


@pytest.mark.parametrize(
    ("report", "phase", "registration", "handover"),
    COMBINATIONS,
    ids=[f"{e}-{p.name}-{r.name}-{'handover' if h else 'alone'}" for e, p, r, h in COMBINATIONS],
)
def test_every_report_in_every_state_does_what_the_table_says(
    report: str, phase: Phase, registration: Registration, handover: bool
) -> None:
    machine = machine_in(phase, registration, handover)
    actions = shown(REPORTS[report][0](machine))
    assert (actions, machine.phase, machine.next_step()) == expected(report, phase, registration, handover)


def test_every_row_of_the_table_is_reached() -> None:
    """By some report above, and every event has a row: no row goes untested, no event unused."""
    reached = {(r, p, taken_as(report, p, h)) for report, p, r, h in COMBINATIONS}
    rows = {(r, p, e) for r, table in TRANSITIONS.items() for p, e in table}
    assert rows - reached == set()
    assert {e for _, _, e in rows} == set(Event)


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

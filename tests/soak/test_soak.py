"""The soak suite's short run, as CI makes it, and the checks that make its verdict mean something.

The long run is the same code with more faults: `python -m tests.soak --faults 1000`.
"""

from __future__ import annotations

import grpc
import pytest

from shim.compat.fakekubelet import PluginOptions, PluginSession
from shim.compat.fakekubelet.records import HEALTHY, UNHEALTHY, DeviceState
from shim.compat.modes import PROFILES
from tests.soak.faults import FAULTS
from tests.soak.invariants import RECOVERY_BUDGET_S, ListChecker, clear
from tests.soak.report import Journal, reason, render
from tests.soak.runner import SoakOptions, run_soak
from tests.soak.world import SERVED
from tests.support.waiting import bounded

# About 30 s on an idle 2-core machine; every kind is injected at least once whatever the seed.
SHORT_RUN = SoakOptions(faults=22, seed=20261130)


@pytest.mark.timeout(300)
async def test_a_short_soak_keeps_every_invariant_through_every_kind_of_fault() -> None:
    """A real devshim process with two sim drivers and a static resource, the fake kubelet
    admitting pods all along, and 22 faults of every kind at random: no Allocate hangs or fails
    without a clear status, no list the kubelet gets lacks a device, and after each fault
    everything is registered, listed Healthy and up again within 2 s."""
    report = await bounded(run_soak(SHORT_RUN), 280, "the short soak")  # before pytest's 300 s
    print(render(report))
    assert report["violations"] == [], f"{render(report)}\ndevshim's log ends:\n{report['devshim_log_tail']}"
    assert {kind for kind, stats in report["faults"].items() if stats["injected"]} == set(FAULTS)
    assert report["faults_injected"] == SHORT_RUN.faults
    restarted_as = {variant.partition("/")[0] for variant in report["faults"]["kubelet_restart"]["variants"]}
    assert restarted_as == set(PROFILES)  # each release's cleanup of device-plugins/
    assert report["recovery_max_s"] <= RECOVERY_BUDGET_S
    allocate = report["calls"]["Allocate"]
    # Pods kept being admitted through the faults: most calls succeed, and failures have causes.
    assert allocate["ok"] >= 200 and allocate["ok"] >= 0.9 * allocate["made"], allocate
    # Every fault but those of PodResources makes the kubelet receive at least one new list.
    assert report["lists_received"] >= report["faults_injected"]
    assert report["podresources"]["rejected"] > 0  # the rate-limit fault really rejected devshim's polls
    assert report["devshim_starts"] == 1 + report["faults"]["devshim_kill"]["injected"]


def session(resource: str) -> PluginSession:
    # The checker only reads `resource` and `lists`: no client is ever called.
    return PluginSession(resource, "x.sock", PluginOptions(), client=None, version="v1beta1")  # type: ignore[arg-type]


def test_the_list_checker_flags_a_list_lacking_a_device_but_not_one_listing_it_unhealthy() -> None:
    """Unhealthy during a fault is allowed; a device missing from a list (the kubelet would remove
    it from the node) is a violation, and so is a device no driver has."""
    journal = Journal()
    served = SERVED[0]
    first, *rest = sorted(served.devices)
    watched = session(served.name)
    checker = ListChecker(journal, [watched])
    watched.lists.append(tuple(DeviceState(d, UNHEALTHY) for d in sorted(served.devices)))
    checker.sweep()
    assert journal.violations == [] and journal.lists == 1
    watched.lists.append(tuple(DeviceState(d, HEALTHY) for d in [*rest, "stranger"]))
    checker.sweep()
    checker.sweep()  # each list is checked once
    assert [v.invariant for v in journal.violations] == ["device_missing", "device_unknown"]
    assert repr(first) in journal.violations[0].detail


@pytest.mark.parametrize(
    ("code", "details", "expected"),
    [
        (grpc.StatusCode.UNAVAILABLE, "driver 'soak-a': allocate: the driver is not running", True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "driver 'soak-a': it did not answer allocate within 0.5 s", True),
        (grpc.StatusCode.UNAVAILABLE, "", False),
        (grpc.StatusCode.UNKNOWN, "Exception calling application: KeyError('a-0')", False),
        (grpc.StatusCode.INTERNAL, "Unexpected <class 'AssertionError'>: ", False),
    ],
)
def test_a_failed_call_is_clear_only_with_a_cause_the_kubelet_can_log(
    code: grpc.StatusCode, details: str, expected: bool
) -> None:
    """An error is fine during a fault if it says why; an empty message or gRPC's text for an
    exception devshim let escape is not."""
    assert clear(code, details) is expected


def test_failure_reasons_with_other_numbers_paths_and_instances_count_as_one() -> None:
    a = "UNAVAILABLE: recvmsg:Connection reset by peer (104) at /tmp/ds-soak-x/dp/devshim-a-1f2e3d.sock"
    b = "UNAVAILABLE: recvmsg:Connection reset by peer (32) at /tmp/ds-soak-y/dp/devshim-a-abcdef.sock"
    assert reason(a) == reason(b)
    assert reason("within 0.5 s") != reason("the driver is not running")

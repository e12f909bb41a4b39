"""compat's results show lists as plain text (shim.compat.plain), never Python reprs (issue 45)."""

from __future__ import annotations

from shim.compat.plain import devices, flags, health, listing


def test_items_read_as_words_and_nothing_reads_none() -> None:
    assert listing(["fpga-0", "fpga-1"]) == "fpga-0, fpga-1"
    assert listing([0, 1]) == "0, 1"
    assert listing([]) == "none"


def test_health_changes_read_as_devices_and_their_health() -> None:
    shown = health([("fpga-1", "Unhealthy"), ("fpga-2", "Healthy")])
    assert shown == "fpga-1 Unhealthy, fpga-2 Healthy"
    assert not set("[]()'") & set(shown)


def test_devices_show_their_numa_nodes_only_when_they_have_some() -> None:
    shown = devices([("fpga-0", "Healthy", (0,)), ("fpga-2", "Unhealthy", (0, 1)), ("fan0", "Healthy", ())])
    assert shown == "fpga-0 Healthy NUMA 0, fpga-2 Unhealthy NUMA 0+1, fan0 Healthy"


def test_flags_read_yes_or_no() -> None:
    assert flags({"pre-start": True, "preferred": False}) == "pre-start yes, preferred no"

"""What compat's results and failures show of lists, as plain text: never a Python repr such as
``[('fpga-1', 'Unhealthy')]`` (issue 45); a driver author reads them, whatever their language."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def listing(values: Iterable[object]) -> str:
    """Items one after another: "fpga-0, fpga-1"; "none" for no item."""
    shown = [str(v) for v in values]
    return ", ".join(shown) if shown else "none"


def health(pairs: Iterable[tuple[str, str]]) -> str:
    """Devices with their health: "fpga-0 Healthy, fpga-1 Unhealthy"."""
    return listing(f"{device} {state}" for device, state in pairs)


def devices(entries: Iterable[tuple[str, str, Iterable[int]]]) -> str:
    """Devices with their health and NUMA nodes: "fpga-0 Healthy NUMA 0, fpga-2 Healthy NUMA 0+1,
    fan0 Healthy" (no NUMA node, none shown)."""
    return listing(
        f"{device} {state}" + (f" NUMA {'+'.join(numa)}" if (numa := [str(n) for n in numa_nodes]) else "")
        for device, state, numa_nodes in entries
    )


def flags(values: Mapping[str, bool]) -> str:
    """Named yes/no settings: "pre_start_required yes, get_preferred_allocation_available no"."""
    return listing(f"{name} {'yes' if on else 'no'}" for name, on in values.items())

"""Counter sets a resource's devices share (DRA partitionable devices), across both APIs.

A GPU brings a counter set (its memory, its slices); the whole GPU and each of its partitions
consume from it. The scheduler counts what DRA claims consume; nobody counts what containers take
through the device plugin, which has no counters. So devshim does (core/holds.py): the device
plugin lists a device Unhealthy while what it consumes does not fit what the held devices leave,
and DRA publishes each set less what the devices containers hold consume, so the scheduler never
places a partition on counters a container uses. Exact arithmetic: driverprotocol.quantity_value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from fractions import Fraction

from shim.driverprotocol import quantity_value
from shim.model import CounterSet, Device

# Set name -> counter -> the amount left.
Left = dict[str, dict[str, Fraction]]


def left_after(devices: Mapping[str, Device], held: Iterable[str]) -> Left:
    """What each set the devices bring has left once the ``held`` devices' consumption is taken."""
    left = {
        c.name: {name: quantity_value(q) for name, q in c.counters}
        for device in devices.values()
        for c in device.counter_sets
    }
    for device_id in held:
        device = devices.get(device_id)
        if device is not None:
            take(left, device)
    return left


def take(left: Left, device: Device) -> None:
    for use in device.consumes_counters:
        counters = left.get(use.name)
        if counters is not None:
            for name, amount in consumption(use):
                counters[name] = counters.get(name, Fraction(0)) - amount


def consumption(use: CounterSet) -> list[tuple[str, Fraction]]:
    """What one consumption takes, counter by counter."""
    return [(name, quantity_value(q)) for name, q in use.counters]


def short(device: Device, left: Left) -> str | None:
    """The set whose counters ``device``'s consumption does not fit, or None where it fits (a set
    no device brings constrains nothing here: DRA leaves such a consumer unallocatable)."""
    for use in device.consumes_counters:
        counters = left.get(use.name)
        if counters is not None and any(
            counters.get(n, Fraction(0)) < quantity_value(q) for n, q in use.counters
        ):
            return use.name
    return None


def reduced(devices: tuple[Device, ...], used: Left) -> tuple[Device, ...]:
    """The devices with each set they bring less ``used`` (what device-plugin holds consume)."""
    if not any(any(amount for amount in counters.values()) for counters in used.values()):
        return devices
    out = []
    for device in devices:
        if device.counter_sets and any(c.name in used for c in device.counter_sets):
            device = replace(
                device, counter_sets=tuple(_less(c, used.get(c.name, {})) for c in device.counter_sets)
            )
        out.append(device)
    return tuple(out)


def _less(counter_set: CounterSet, used: Mapping[str, Fraction]) -> CounterSet:
    counters = tuple(
        (name, quantity_text(max(quantity_value(q) - used.get(name, Fraction(0)), Fraction(0))))
        for name, q in counter_set.counters
    )
    return CounterSet(counter_set.name, counters)


_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def quantity_text(value: Fraction) -> str:
    """A non-negative amount as a quantity: whole (in the largest binary unit it is a whole number
    of, as memory is written: "40Gi"), else in thousandths rounded down (what is left over is
    never overstated)."""
    if value.denominator != 1:
        return f"{int(value * 1000)}m"
    whole = value.numerator
    for suffix, unit in _BINARY:
        if whole and whole % unit == 0:
            return f"{whole // unit}{suffix}"
    return str(whole)

"""What both ends of the driver pipe share beyond the schema (proto/driver/v1/driver.proto).

The driver host and the SDK import it from here, the one layer both may import. Copies outside
Python (adapters/examples/node/driver.js, docs/driver-protocol.md) are checked against it by
tests/unit/test_one_truth.py.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from shim.facts import SEMVER, is_dns_label, is_dns_subdomain, is_label_name, is_label_value
from shim.model import (
    Attribute,
    AttributeKind,
    BindingCondition,
    CapacityPolicy,
    CounterSet,
    DeviceBinding,
    DeviceShare,
    DeviceTaint,
)

# Semver; the majors of devshim and a driver must be equal (docs/driver-protocol.md, "Lifecycle").
# 1.1 added device attributes and capacity (DRA); 1.2 the CDI specs a driver ships in
# initialize; 1.3 device taints, partitions, shares and admin access (DRA); 1.4 binding conditions
# and attach (DRA). An older driver leaves them out.
PROTOCOL_VERSION = "1.4.0"
PROTOCOL_MAJOR = PROTOCOL_VERSION.split(".")[0]

# --- protocol 1.2: the CDI specs a driver ships (devshim's bounds: a node's few device kinds, and
# the partitions of its devices) ------------------------------------------------------------------

MAX_CDI_SPECS = 16
# Devices over all of a driver's specs: each is checked against its policy on devshim's loop
# (about 0.12 ms a device here), so 65,536 would cost it 8 s; a node's devices and their
# partitions number in the tens to hundreds.
MAX_CDI_SPEC_DEVICES = 1024

# --- protocol 1.3: device taints (resource.k8s.io DeviceTaint) ------------------------------------

# DeviceTaintsMaxLength is 4 in 1.33 and 1.34 and 16 from 1.35 on: 4 publishes on every release.
MAX_DEVICE_TAINTS = 4
# The effects every release with taints validates (validDeviceTaintEffects); "None" only from 1.35.
TAINT_EFFECTS = ("NoSchedule", "NoExecute")

# --- protocol 1.3: partitionable devices (resource.k8s.io CounterSet, DeviceCounterConsumption, 1.36's
# limits: ResourceSliceMaxCounterSets, ...CountersPerCounterSet, ...DeviceCounterConsumptionsPerDevice)

MAX_DEVICE_COUNTER_SETS = 8  # the sets one device brings (a slice takes 8: ResourceSliceMaxCounterSets)
MAX_COUNTERS = 32  # per set, and per consumption
MAX_CONSUMPTIONS = 2  # counter sets one device consumes from

# --- protocol 1.4: binding conditions (resource.k8s.io BindingConditionsMaxSize, ...FailureConditions...)

MAX_BINDING_CONDITIONS = 4  # each of conditions and failure_conditions
MAX_CONDITION_REASON = 128  # devshim's bound (metav1.Condition allows 1,024)
MAX_CONDITION_MESSAGE = 1024  # devshim's bound (metav1.Condition allows 32,768)
# metav1.Condition's reason: CamelCase, a letter first (apimachinery's ValidateCondition).
_CONDITION_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")

# --- protocol 1.1: what DRA publishes per device (resource.k8s.io's limits, every version) ----

MAX_ATTRIBUTES_AND_CAPACITIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_ATTRIBUTE_VALUE_LENGTH = 64  # DeviceAttributeMaxValueLength (strings and versions)
MAX_NAME_DOMAIN_LENGTH = 63  # DeviceMaxDomainLength: the DNS subdomain before "/"
MAX_NAME_ID_LENGTH = 32  # DeviceMaxIDLength: the C identifier
MAX_QUANTITY_LENGTH = 64  # devshim's own bound on a capacity's text
INT64 = (-(2**63), 2**63 - 1)

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Digits are [0-9], never \d: Python's \d also takes "٣" and "١", which the API server refuses.
# Kubernetes' quantity notation (apimachinery resource.Quantity), non-negative.
_QUANTITY = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
_INT64_TEXT = re.compile(r"-?[0-9]{1,19}")


def qualified_name_problem(name: str) -> str | None:
    """Why `name` cannot name an attribute or capacity, or None: a C identifier of at most 32
    characters, optionally after a DNS subdomain of at most 63 and "/"."""
    domain, slash, ident = name.rpartition("/")
    if slash and (not domain or not is_dns_subdomain(domain, MAX_NAME_DOMAIN_LENGTH)):
        return f"{name!r}: before '/' must be a DNS subdomain of at most {MAX_NAME_DOMAIN_LENGTH} characters"
    if not _C_IDENTIFIER.fullmatch(ident) or len(ident) > MAX_NAME_ID_LENGTH:
        return f"{name!r}: the name must be a C identifier of at most {MAX_NAME_ID_LENGTH} characters"
    return None


def quantity_problem(text: str) -> str | None:
    """Why `text` is not a non-negative Kubernetes quantity ("80Gi", "1500m", "4"), or None."""
    if len(text) > MAX_QUANTITY_LENGTH or not _QUANTITY.fullmatch(text):
        return f"{text[:MAX_QUANTITY_LENGTH]!r} is not a quantity such as 80Gi, 1500m or 4"
    return None


def version_problem(text: str) -> str | None:
    """Why `text` is not a semantic version of at most 64 characters, or None."""
    if len(text) > MAX_ATTRIBUTE_VALUE_LENGTH or not SEMVER.fullmatch(text):
        shown = text[:MAX_ATTRIBUTE_VALUE_LENGTH]
        return f"{shown!r} is not a semantic version (semver.org 2.0.0) of at most 64 characters"
    return None


class ProtocolVersionRefused(ValueError):
    """The other end speaks a protocol version this one cannot talk to; ``malformed`` when it is
    not a version at all rather than another major."""

    def __init__(self, message: str, *, malformed: bool) -> None:
        super().__init__(message)
        self.malformed = malformed


def check_protocol_version(theirs: object) -> None:
    """The rule both ends apply in initialize (docs/driver-protocol.md, "Lifecycle"): semver in
    ASCII digits ("1.٣.0" is not one), and majors equal; minors may differ either way."""
    if not isinstance(theirs, str):
        raise ProtocolVersionRefused(f"protocol version {theirs!r} is not a semantic version", malformed=True)
    if (problem := version_problem(theirs)) is not None:
        raise ProtocolVersionRefused(f"protocol version {problem}", malformed=True)
    if theirs.split(".")[0] != PROTOCOL_MAJOR:
        raise ProtocolVersionRefused(f"protocol version {theirs} is of another major", malformed=False)


def _attribute_from_json(name: str, value: Any) -> Attribute:
    where = f"attribute {name!r}"
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError(f"{where} must be an object with exactly one of int, bool, string, version")
    ((kind, item),) = value.items()
    if kind == "int":
        # proto3 JSON writes an int64 as a string of digits; a number is accepted too. ASCII digits
        # only: int() and isdigit() also take "١٢" (and isdigit "²", which int() then refuses).
        if type(item) is str and _INT64_TEXT.fullmatch(item):
            item = int(item)
        if type(item) is not int or not INT64[0] <= item <= INT64[1]:
            raise ValueError(f"{where}: int must be a 64-bit integer, not {item!r}")
        return Attribute(AttributeKind.INT, item)
    if kind == "bool":
        if type(item) is not bool:
            raise ValueError(f"{where}: bool must be true or false, not {item!r}")
        return Attribute(AttributeKind.BOOL, item)
    if kind in ("string", "version"):
        if type(item) is not str:
            raise ValueError(f"{where}: {kind} must be a string")
        problem = version_problem(item) if kind == "version" else None
        if problem is None and len(item) > MAX_ATTRIBUTE_VALUE_LENGTH:
            problem = f"at most {MAX_ATTRIBUTE_VALUE_LENGTH} characters, not {len(item)}"
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
        return Attribute(AttributeKind(kind), item)
    raise ValueError(f"{where}: {kind!r} is not one of int, bool, string, version")


def attributes_from_json(value: Any) -> tuple[tuple[str, Attribute], ...]:
    """A device's attributes in their JSON form (the schema's), checked; ValueError says why not."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ValueError("attributes must be an object")
    for name in value:
        if (problem := qualified_name_problem(name)) is not None:
            raise ValueError(f"attribute {problem}")
    return tuple(sorted((name, _attribute_from_json(name, v)) for name, v in value.items()))


def capacity_from_json(value: Any) -> tuple[tuple[str, str], ...]:
    """A device's capacities (name: quantity), checked; ValueError says why not."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ValueError("capacity must be an object")
    for name, quantity in value.items():
        if (problem := qualified_name_problem(name)) is not None:
            raise ValueError(f"capacity {problem}")
        if type(quantity) is not str or (problem := quantity_problem(quantity)) is not None:
            raise ValueError(f"capacity {name!r}: {problem or 'must be a string such as 80Gi'}")
    return tuple(sorted(value.items()))


def taints_from_json(value: Any) -> tuple[DeviceTaint, ...]:
    """A device's taints in their JSON form, checked as the API server checks them; ValueError
    says why not."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError("taints must be a list")
    if len(value) > MAX_DEVICE_TAINTS:
        raise ValueError(f"{len(value)} taints; at most {MAX_DEVICE_TAINTS} publish on every release")
    taints = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"taints[{i}] must be an object with key, value and effect")
        key, text, effect = item.get("key"), item.get("value", ""), item.get("effect")
        if type(key) is not str or not is_label_name(key):
            raise ValueError(
                f"taints[{i}]: key {repr(key)[:80]} is not a label name such as example.com/going-away"
            )
        if type(text) is not str or not is_label_value(text):
            raise ValueError(
                f"taints[{i}]: value {repr(text)[:80]} is not a label value (63 characters, [-_.A-Za-z0-9])"
            )
        if effect not in TAINT_EFFECTS:
            raise ValueError(
                f"taints[{i}]: effect {repr(effect)[:80]} is not one of {', '.join(TAINT_EFFECTS)}"
            )
        taints.append(DeviceTaint(key, text, effect))
    return tuple(taints)


def counter_sets_from_json(value: Any, what: str = "counter_sets") -> tuple[CounterSet, ...]:
    """Counter sets (``counter_sets``) or a device's consumption of them (``consumes_counters``,
    whose name field is ``counter_set``), checked as the API server checks them; ValueError says
    why not."""
    if value is None:
        return ()
    consumed = what == "consumes_counters"
    limit, key = (MAX_CONSUMPTIONS, "counter_set") if consumed else (MAX_DEVICE_COUNTER_SETS, "name")
    if not isinstance(value, list) or len(value) > limit:
        raise ValueError(f"{what} must be a list of at most {limit}")
    found = []
    for i, item in enumerate(value):
        name = item.get(key, item.get("counterSet")) if isinstance(item, dict) else None
        if type(name) is not str or not is_dns_label(name):
            raise ValueError(f"{what}[{i}]: {key} {repr(name)[:80]} is not a DNS label such as gpu-0")
        counters = item.get("counters")
        if not isinstance(counters, dict) or not 0 < len(counters) <= MAX_COUNTERS:
            raise ValueError(
                f"{what}[{i}] ({name}): counters must map 1 to {MAX_COUNTERS} names to quantities"
            )
        for counter, amount in counters.items():
            if not is_dns_label(counter):
                raise ValueError(f"{what}[{i}] ({name}): counter {counter[:80]!r} is not a DNS label")
            problem = quantity_problem(amount) if type(amount) is str else "must be a quantity such as 80Gi"
            if problem is not None:
                raise ValueError(f"{what}[{i}] ({name}): counter {counter!r}: {problem}")
        found.append(CounterSet(name, tuple(sorted(counters.items()))))
    if len({c.name for c in found}) != len(found):
        raise ValueError(f"{what}: a counter set is named twice")
    return tuple(found)


def share_json(share: DeviceShare) -> dict[str, Any]:
    """A DeviceShare in the schema's JSON form (devshim's checkpoint keeps it so too)."""
    return {
        "device_id": share.device_id,
        "share_id": share.share_id,
        "consumed_capacity": dict(share.consumed_capacity),
    }


def capacity_policies_from_json(
    value: Any, capacity: tuple[tuple[str, str], ...], shared: bool
) -> tuple[tuple[str, CapacityPolicy], ...]:
    """A device's capacity_policies (protocol 1.3; 1.4 valid values and range) as (capacity,
    policy) pairs, checked as every release with consumable capacity checks a requestPolicy: only
    on a device claims may share, only for a capacity it has, a default no larger than it, and a
    choice of valid values or a range that holds the default (1.34's integer arithmetic: a range
    with a step is in whole numbers). ValueError says why not."""
    if not value:
        return ()
    if not isinstance(value, dict):
        raise ValueError("capacity_policies must be an object")
    if not shared:
        raise ValueError(
            "capacity_policies need allow_multiple_allocations (a requestPolicy is for shared devices)"
        )
    has = dict(capacity)
    found = []
    for name, policy in value.items():
        if name not in has:
            raise ValueError(
                f"capacity_policies names {str(name)[:80]!r}, which is not among the device's capacity"
            )
        if not isinstance(policy, dict):
            raise ValueError(f"capacity_policies[{name!r}] must be an object with a default")
        where = f"capacity_policies[{name!r}]"
        most = quantity_value(has[name])
        default = _quantity(policy.get("default"), f"{where}.default")
        if default[1] > most:
            raise ValueError(f"{where}.default {default[0]} is more than the capacity, {has[name]}")
        values = policy.get("valid_values", policy.get("validValues")) or []
        ranged = policy.get("valid_range", policy.get("validRange"))
        if values and ranged:
            raise ValueError(f"{where}: valid_values or valid_range, not both")
        found.append((name, CapacityPolicy(
            default[0],
            _valid_values(values, default, most, where),
            _valid_range(ranged, default, most, where) if ranged else None,
        )))  # fmt: skip
    return tuple(sorted(found, key=lambda pair: pair[0]))


MAX_VALID_VALUES = 10  # CapacityRequestPolicyDiscreteMaxOptions


def policy_json(policy: CapacityPolicy) -> dict[str, Any]:
    """A CapacityPolicy in the schema's JSON form (devshim's inventory keeps it so too)."""
    written: dict[str, Any] = {"default": policy.default}
    if policy.valid_values:
        written["valid_values"] = list(policy.valid_values)
    if policy.valid_range is not None:
        ranged = zip(("min", "max", "step"), policy.valid_range, strict=True)
        written["valid_range"] = {key: text for key, text in ranged if text}
    return written


def _quantity(text: Any, what: str) -> tuple[str, Fraction]:
    if type(text) is not str:
        raise ValueError(f"{what} must be a quantity such as 4Gi")
    if (problem := quantity_problem(text)) is not None:
        raise ValueError(f"{what}: {problem}")
    return text, quantity_value(text)


def _valid_values(values: Any, default: tuple[str, Fraction], most: Fraction, where: str) -> tuple[str, ...]:
    if not values:
        return ()
    if not isinstance(values, list) or len(values) > MAX_VALID_VALUES:
        raise ValueError(f"{where}.valid_values must be a list of at most {MAX_VALID_VALUES} quantities")
    read = [_quantity(v, f"{where}.valid_values[{i}]") for i, v in enumerate(values)]
    amounts = [amount for _, amount in read]
    if amounts != sorted(amounts):
        raise ValueError(f"{where}.valid_values must be in ascending order")
    # Told apart as the API server's integer keys tell them (Quantity.Value(), rounded up).
    if len({math.ceil(a) for a in amounts}) != len(amounts):
        raise ValueError(f"{where}.valid_values holds one value twice (in whole units)")
    if amounts[-1] > most:
        raise ValueError(f"{where}.valid_values: {read[-1][0]} is more than the capacity")
    if default[1] not in amounts:
        raise ValueError(f"{where}.valid_values must hold the default, {default[0]}")
    return tuple(text for text, _ in read)


def _valid_range(
    ranged: Any, default: tuple[str, Fraction], most: Fraction, where: str
) -> tuple[str, str, str]:
    if not isinstance(ranged, dict):
        raise ValueError(f"{where}.valid_range must be an object with min, max and step")
    least = _quantity(ranged.get("min"), f"{where}.valid_range.min")
    top = _quantity(ranged["max"], f"{where}.valid_range.max") if ranged.get("max") else None
    step = _quantity(ranged["step"], f"{where}.valid_range.step") if ranged.get("step") else None
    if not least[1] <= default[1] <= (top[1] if top else most) <= most:
        raise ValueError(
            f"{where}.valid_range: min {least[0]} <= default {default[0]} <= max "
            f"{top[0] if top else '(none)'} <= the capacity must hold"
        )
    if step is not None:
        whole = [q for q in (least, default, top, step) if q is not None]
        if step[1] <= 0 or any(q[1].denominator != 1 for q in whole):
            raise ValueError(
                f"{where}.valid_range: a step, and the values it steps, are whole numbers above 0"
            )
        if least[1] + step[1] > most:
            raise ValueError(f"{where}.valid_range: min plus one step is more than the capacity")
        if any((q[1] - least[1]) % step[1] for q in (default, top) if q is not None):
            raise ValueError(f"{where}.valid_range: default and max must be min plus whole steps")
    return least[0], top[0] if top else "", step[0] if step else ""


_SUFFIXES: dict[str, int | Fraction] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "m": Fraction(1, 1000), "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip


def quantity_value(text: str) -> Fraction:
    """A quantity that passed ``quantity_problem``, exactly (resource.Quantity's suffixes)."""
    match = _QUANTITY.fullmatch(text)
    assert match is not None, text
    number, suffix = match.group(1), match.group(3) or ""
    amount = Fraction(number + "0" if number.endswith(".") else number)  # "5." is a quantity
    if suffix in _SUFFIXES:
        return amount * _SUFFIXES[suffix]
    return amount * Fraction(10) ** int(suffix[1:])  # an exponent: "1e3", "5E-1"


def _condition_types(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_BINDING_CONDITIONS:
        raise ValueError(f"{what} must be a list of 1 to {MAX_BINDING_CONDITIONS} condition types")
    for i, name in enumerate(value):
        if type(name) is not str or not is_label_name(name):
            raise ValueError(
                f"{what}[{i}]: {repr(name)[:80]} is not a condition type (a label name such as "
                "gpu.example.com/attached)"
            )
    if len(set(value)) != len(value):
        raise ValueError(f"{what} names a condition twice")
    return tuple(value)


def binding_from_json(value: Any) -> DeviceBinding | None:
    """A device's binding (protocol 1.4) in its JSON form, checked as the API server checks a
    device's bindingConditions and bindingFailureConditions; ValueError says why not."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("binding must be an object")
    conditions = _condition_types(value.get("conditions"), "binding.conditions")
    failures = value.get("failure_conditions", value.get("failureConditions"))
    failure_conditions = _condition_types(failures, "binding.failure_conditions")
    if overlap := sorted(set(conditions) & set(failure_conditions)):
        raise ValueError(f"binding: {overlap[0]!r} is both a condition and a failure condition")
    binds = value.get("binds_to_node", value.get("bindsToNode", False))
    if type(binds) is not bool:
        raise ValueError("binding.binds_to_node must be true or false")
    return DeviceBinding(conditions, failure_conditions, binds)


def conditions_from_json(value: Any, binding: DeviceBinding) -> tuple[BindingCondition, ...]:
    """attach's answer: each condition one of ``binding``'s (a driver sets only what its device
    declared), at most once, its reason and message within devshim's bounds; ValueError says why
    not."""
    conditions = value.get("conditions", []) if isinstance(value, dict) else None
    if not isinstance(conditions, list):
        raise ValueError("attach's result must be an object with a list of conditions")
    declared = binding.conditions + binding.failure_conditions
    found: list[BindingCondition] = []
    for i, item in enumerate(conditions):
        if not isinstance(item, dict):
            raise ValueError(f"conditions[{i}] must be an object with type and status")
        kind, status = item.get("type"), item.get("status", False)
        reason, message = item.get("reason", ""), item.get("message", "")
        if kind not in declared:
            raise ValueError(
                f"conditions[{i}]: type {repr(kind)[:80]} is not one the device declares "
                f"({', '.join(declared)})"
            )
        if any(c.type == kind for c in found):
            raise ValueError(f"conditions[{i}]: {kind!r} is answered twice")
        if type(status) is not bool:
            raise ValueError(f"conditions[{i}]: status must be true or false")
        if type(reason) is not str or (
            reason and (len(reason) > MAX_CONDITION_REASON or not _CONDITION_REASON.fullmatch(reason))
        ):
            raise ValueError(
                f"conditions[{i}]: reason {repr(reason)[:80]} is not CamelCase of at most "
                f"{MAX_CONDITION_REASON} characters (letters, digits, _ , :), a letter first"
            )
        if type(message) is not str or len(message) > MAX_CONDITION_MESSAGE:
            raise ValueError(
                f"conditions[{i}]: message must be a string of at most {MAX_CONDITION_MESSAGE} characters"
            )
        found.append(BindingCondition(kind, status, reason, message))
    return tuple(found)

"""A driver's own configuration, read and checked the way devshim reads its settings.

    from shim.sdk.config import ConfigError, format_validation_error, read_config_file

``read_config_file`` reads a YAML (or JSON) file into a mapping, raising ``ConfigError`` with a
message that says why it cannot; ``format_validation_error`` turns pydantic's ValidationError into
one line per problem, each naming its field as a YAML path reads (``groups[0].resource``). The
bounds devshim applies to what a driver declares are here too, so a driver refuses a bad value in
its configuration, where it is written, instead of devshim refusing the driver's answers later:
``check_extended_resource_name`` (the kubelet's rule for resource names), ``MAX_NUMA_NODE``, and
DRA's rules for attributes and capacity (``attributes_from_json`` and ``capacity_from_json`` raise
ValueError naming what breaks them; ``MAX_ATTRIBUTE_VALUE_LENGTH``).
"""

from collections import Counter
from collections.abc import Iterable

from shim.configfile import ConfigError, format_validation_error, read_config_file
from shim.driverprotocol import (
    MAX_ATTRIBUTE_VALUE_LENGTH,
    attributes_from_json,
    binding_from_json,
    capacity_from_json,
    capacity_policies_from_json,
    counter_sets_from_json,
    taints_from_json,
)
from shim.model import MAX_NUMA_NODE
from shim.names import check_extended_resource_name

__all__ = [
    "MAX_ATTRIBUTE_VALUE_LENGTH",
    "MAX_NUMA_NODE",
    "ConfigError",
    "attributes_from_json",
    "binding_from_json",
    "capacity_policies_from_json",
    "capacity_from_json",
    "check_extended_resource_name",
    "counter_sets_from_json",
    "format_validation_error",
    "read_config_file",
    "refuse_duplicates",
    "taints_from_json",
]


def refuse_duplicates(names: Iterable[str], what: str) -> None:
    """ValueError naming every name given more than once (in a model validator, pydantic
    reports it at the field): ``what`` says what they name, e.g. "resource(s)"."""
    twice = sorted(name for name, times in Counter(names).items() if times > 1)
    if twice:
        raise ValueError(f"{what} configured twice: {', '.join(twice)}")

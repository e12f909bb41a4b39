"""A driver's own configuration, read and checked the way devshim reads its settings.

    from shim.sdk.config import ConfigError, format_validation_error, read_config_file

``read_config_file`` reads a YAML (or JSON) file into a mapping, raising ``ConfigError`` with a
message that says why it cannot; ``format_validation_error`` turns pydantic's ValidationError into
one line per problem, each naming its field as a YAML path reads (``groups[0].resource``). The
bounds devshim applies to what a driver declares are here too, so a driver refuses a bad value in
its configuration, where it is written, instead of devshim refusing the driver's answers later:
``check_extended_resource_name`` (the kubelet's rule for resource names) and ``MAX_NUMA_NODE``.
"""

from shim.configfile import ConfigError, format_validation_error, read_config_file
from shim.model import MAX_NUMA_NODE
from shim.names import check_extended_resource_name

__all__ = [
    "MAX_NUMA_NODE",
    "ConfigError",
    "check_extended_resource_name",
    "format_validation_error",
    "read_config_file",
]

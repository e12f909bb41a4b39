"""What both ends of the driver pipe share beyond the schema (proto/driver/v1/driver.proto).

The driver host and the SDK import it from here, the one layer both may import. Copies outside
Python (adapters/examples/node/driver.js, docs/driver-protocol.md) are checked against it by
tests/unit/test_one_truth.py.
"""

from __future__ import annotations

# Semver; the majors of devshim and a driver must be equal (docs/driver-protocol.md, "Lifecycle").
PROTOCOL_VERSION = "1.0.0"

"""The Python driver SDK: write a devshim driver as one class (the guide: docs/sdk.md).

    from shim.sdk import Driver, run, types

    class Fans(Driver):
        def resources(self): ...
        async def list_devices(self, resource): ...
        async def allocate(self, resource, containers): ...

    run(Fans())

The SDK does the framing, the concurrency (every request in its own task), the
dispatch, the params checks (-32602), the errors of the protocol (DriverError,
UnknownDevice; unknown resources and undeclared optional methods are answered
for the driver), the protocol version check, and the notifications
(``Driver.devices_changed`` and friends). Messages are the betterproto2
dataclasses in ``types``, generated from proto/driver/v1/driver.proto.
``ConnectionClosed`` is what a notification raises once devshim has gone, and
``DEVSHIM_VERSION`` the version of the devshim this SDK ships with (the
drivers in adapters/ report it as their own).

Two submodules carry what drivers share with devshim beyond the protocol:
``shim.sdk.grants`` (grant templates, expanded and merged as devshim does) and
``shim.sdk.config`` (a driver's configuration file read and checked as
devshim's settings are). The SDK imports nothing of devshim's own side
(settings, driver host, core, front end): only the JSON-RPC peer, its
generated code, and those shared pieces (lint-imports checks it).

Device lists are encoded without betterproto2's generic ``to_dict`` (codec.py).
For 50,000 devices with declared grants (an env and a mount each, 8.8 MiB of
JSON) the SDK spends ~0.3 s building the dicts and ~0.2 s serializing them, on
a 2-core machine where ``to_dict`` alone takes ~25 s; the simulator answers
such a list_devices over a pipe in ~1.3 s end to end, the reader's parse included.
"""

import sys

if "betterproto2" not in sys.modules and "pydantic" not in sys.modules:
    # betterproto2 imports pydantic whenever it is installed (as it is beside devshim), for
    # pydantic-dataclass messages, which the SDK's are not: 3.4 MB of every driver's memory
    # (docs/benchmarks.md). Import it seeing no pydantic; a driver may still import pydantic after.
    sys.modules["pydantic"] = None  # type: ignore[assignment]
    try:
        import betterproto2  # noqa: F401
    finally:
        del sys.modules["pydantic"]

from shim import __version__ as DEVSHIM_VERSION
from shim.driverprotocol import PROTOCOL_VERSION
from shim.jsonrpc import ConnectionClosed, ErrorCode
from shim.sdk.driver import Driver
from shim.sdk.errors import DriverError, UnknownDevice
from shim.sdk.generated.devshim.driver import v1 as types
from shim.sdk.server import serve
from shim.sdk.stdio import run, run_configured

__all__ = [
    "DEVSHIM_VERSION",
    "PROTOCOL_VERSION",
    "ConnectionClosed",
    "Driver",
    "DriverError",
    "ErrorCode",
    "UnknownDevice",
    "run",
    "run_configured",
    "serve",
    "types",
]

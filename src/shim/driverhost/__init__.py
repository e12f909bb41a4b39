"""The driver host: device sources backed by driver subprocesses speaking the driver protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shim.driverhost.host import DriverHost, ResourceRegistry

__all__ = ["DriverHost", "ResourceRegistry"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: devshim always imports the reaper from this package, and a node with
    # static resources only does without the host (its protocol, JSON-RPC, the driver schema).
    if name in __all__:
        from shim.driverhost import host

        return getattr(host, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

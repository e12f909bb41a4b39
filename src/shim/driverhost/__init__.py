"""The driver host: device sources backed by driver subprocesses speaking the driver protocol."""

from shim.driverhost.host import DriverHost, ResourceRegistry

__all__ = ["DriverHost", "ResourceRegistry"]

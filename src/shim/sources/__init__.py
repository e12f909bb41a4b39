"""Device sources: whatever supplies devices to the core (static settings, driver host)."""

from shim.sources.base import DeviceSource
from shim.sources.static import StaticSource

__all__ = ["DeviceSource", "StaticSource"]

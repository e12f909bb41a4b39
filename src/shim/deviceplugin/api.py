"""What the endpoint needs from a kubelet API version module; nothing version-specific."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from shim.core.api import PluginResource
from shim.model import Device


@dataclass(frozen=True)
class ListRefused:
    """devshim ended a ListAndWatch stream itself: ``devices`` cannot reach the kubelet (``reason``)."""

    devices: tuple[Device, ...]
    reason: str


class ServedVersion(Protocol):
    """A version's services hosted on one server."""

    def retire(self) -> None:
        """devshim is closing the server: streams ending now are not the kubelet's doing."""
        ...

    def calls_in_flight(self) -> list[asyncio.Task[Any]]:
        """The unary calls being answered now."""
        ...


class ApiVersion(Protocol):
    """One kubelet device-plugin API version (implemented by shim/deviceplugin/<version>.py)."""

    name: str
    service_names: tuple[str, ...]

    def add_services(
        self, server: Any, resource: PluginResource, on_stream_end: Callable[[ListRefused | None], None]
    ) -> ServedVersion:
        """Host this version's DevicePlugin service for ``resource`` on ``server``.

        ``on_stream_end`` is called with None when the kubelet ends a ListAndWatch stream, and
        with a ListRefused when devshim ended it because the list cannot be sent; not at all
        when devshim closes the server.
        """
        ...

    async def register(
        self, kubelet_socket: Path, endpoint: str, resource: PluginResource, timeout_s: float
    ) -> None:
        """Send Register to the kubelet; raise on any failure."""
        ...

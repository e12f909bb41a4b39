"""The narrow interface between the version-neutral fake kubelet and its per-version modules.

Like the kubelet's plugin/v1beta1/api.go, this is only interfaces: a version module (v1beta1.py,
v1beta2.py) provides a PluginClient that speaks its version of the DevicePlugin service and a way
to serve its Registration service (wire.Wire); fake_kubelet.py and session.py never see a stub. The
PodResources service (podresources.py) likewise reads the kubelet's state through a provider.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from .records import DeviceState, Grant, PluginOptions, RegisterRequest, RunningPod


@dataclass(frozen=True)
class PreferredRequest:
    """One container's GetPreferredAllocation question."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


class PluginClient(Protocol):
    """The kubelet's connection to one registered plugin, in one API version.

    Each call raises grpc.aio.AioRpcError on an RPC failure (including a passed deadline).
    """

    async def connect(self) -> None:
        """Wait until the plugin's socket answers; the caller bounds the wait."""

    async def get_options(self, timeout: float) -> PluginOptions: ...

    def list_and_watch(self) -> AsyncIterator[tuple[DeviceState, ...]]:
        """Every device list the plugin sends, until the stream ends."""
        ...

    async def allocate(self, containers: Sequence[Sequence[str]], timeout: float) -> list[Grant]:
        """One AllocateRequest with one container request per item; the responses, unchecked."""
        ...

    async def preferred_allocation(
        self, requests: Sequence[PreferredRequest], timeout: float
    ) -> list[tuple[str, ...]]: ...

    async def prestart(self, device_ids: Sequence[str], timeout: float) -> None: ...

    async def close(self) -> None:
        """Close the channel; idempotent. Any call in flight on it ends."""


@runtime_checkable
class LifecycleClient(PluginClient, Protocol):
    """A PluginClient of a version with KEP-3162's calls (devshim's experimental v1beta2)."""

    async def deallocate(self, device_ids: Sequence[str], timeout: float) -> None:
        """Deallocate: the devices are free again."""

    async def post_stop(self, device_ids: Sequence[str], timeout: float) -> None:
        """PostStopContainer: a container that used the devices has stopped."""


ClientFactory = Callable[[Path], PluginClient]
"""Builds a client for the plugin socket at the given path."""

RegisterHandler = Callable[[RegisterRequest, float], Awaitable[None]]
"""Handles one Register call (request, received_at); raises RegistrationRejected to refuse it."""


class PodResourcesProvider(Protocol):
    """What the PodResources service asks the kubelet (server_v1.go's pods and devices providers)."""

    def admit_call(self) -> bool:
        """Count one call; False when the rate limit rejects it."""
        ...

    def running_pods(self) -> Sequence[RunningPod]: ...

    def allocatable_devices(self) -> Mapping[str, Sequence[DeviceState]]:
        """resource name -> its devices that are allocatable now (Healthy)."""
        ...

"""The kubelet's PodResources API (v1), as devshim reads it: which devices containers hold.

The only serving-path module that imports the podresources stubs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from shim.errors import ShimError

if TYPE_CHECKING:
    from shim.generated.podresources.v1 import api_pb2 as pb


class PodResourcesUnavailable(ShimError):
    """No PodResources service answers (feature off, an old kubelet, or it is restarting)."""


class RateLimited(ShimError):
    """The kubelet rejected the call: it allows 100 qps with a burst of 10 (RESOURCE_EXHAUSTED)."""


def devices_in_use(response: pb.ListPodResourcesResponse) -> dict[str, set[str]]:
    """resource name -> the device IDs some listed container holds."""
    held: dict[str, set[str]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                held.setdefault(devices.resource_name, set()).update(devices.device_ids)
    return held


class PodResourcesClient:
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self._channel: grpc.aio.Channel | None = None

    async def devices_in_use(self, timeout_s: float = 5.0) -> dict[str, set[str]]:
        if not self.socket.exists():
            raise PodResourcesUnavailable(f"no PodResources socket at {self.socket}")
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix:{self.socket}")
        # The stubs load at the first List: devshim serving static resources only never asks.
        from shim.generated.podresources.v1 import api_pb2 as pb
        from shim.generated.podresources.v1 import api_pb2_grpc as pb_grpc

        stub = pb_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        try:
            response = await stub.List(pb.ListPodResourcesRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise RateLimited(f"PodResources List: {exc.details()}") from None
            await self.close()
            raise PodResourcesUnavailable(
                f"PodResources List at {self.socket}: {exc.code().name}: {exc.details()}"
            ) from None
        return devices_in_use(response)

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close(None)

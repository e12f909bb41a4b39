"""devshim's one exception hierarchy, and its one mapping to gRPC status codes.

ShimError
├── RequestError          the caller asked for something invalid (INVALID_ARGUMENT)
│   ├── UnknownDevice
│   └── UnhealthyDevice
├── SourceUnavailable     the device source cannot answer now (UNAVAILABLE)
├── SourceTimeout         the device source did not answer in time (DEADLINE_EXCEEDED)
└── SourceFailed          the device source answered with an error (INTERNAL)
"""

from __future__ import annotations

import grpc


class ShimError(Exception):
    """Base of every error devshim raises on purpose."""

    status = grpc.StatusCode.INTERNAL


class RequestError(ShimError):
    status = grpc.StatusCode.INVALID_ARGUMENT


class UnknownDevice(RequestError):
    def __init__(self, resource: str, device_id: str) -> None:
        super().__init__(f"{resource}: unknown device ID {device_id!r}")
        self.device_id = device_id


class UnhealthyDevice(RequestError):
    def __init__(self, resource: str, device_id: str) -> None:
        super().__init__(f"{resource}: device {device_id!r} is Unhealthy")
        self.device_id = device_id


class SourceUnavailable(ShimError):
    status = grpc.StatusCode.UNAVAILABLE


class SourceTimeout(ShimError):
    status = grpc.StatusCode.DEADLINE_EXCEEDED


class SourceFailed(ShimError):
    status = grpc.StatusCode.INTERNAL


class ListTooLarge(ShimError):
    """A device list the kubelet could not receive (over its gRPC message limit): not sent."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


def grpc_status(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a gRPC handler answers with for ``error``; the only such mapping."""
    if isinstance(error, ShimError):
        return error.status, str(error)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}"

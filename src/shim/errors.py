"""devshim's one exception hierarchy, and its one mapping to gRPC status codes.

Each class's ``status`` is its gRPC code. The classes of one front end live in the module that
raises them (named in brackets), each a ShimError all the same:

ShimError                 (INTERNAL)
├── RequestError          the caller asked for something invalid (INVALID_ARGUMENT)
│   ├── UnknownDevice
│   └── UnhealthyDevice
├── DeviceHeld            the device is held through the other API (FAILED_PRECONDITION)
├── SourceUnavailable     the device source cannot answer now (UNAVAILABLE)
├── SourceTimeout         the device source did not answer in time (DEADLINE_EXCEEDED)
├── SourceFailed          the device source answered with an error (INTERNAL)
├── GrantRefused          a grant outside the resource's grant policy (PERMISSION_DENIED)
├── ClaimRefused          a driver declared a resource it may not serve (INTERNAL)
├── ListTooLarge          a device list over the kubelet's message limit (RESOURCE_EXHAUSTED)
├── ListNotEncodable      a device list the kubelet's messages cannot carry (INTERNAL)
├── SocketGone            [deviceplugin/endpoint/server.py] our socket vanished: serve again
│                         (UNAVAILABLE; the endpoint cycle's own signal)
│   DRA:
├── ClaimProblem          [dra/claims.py] the claim cannot be prepared here: not allocated,
│                         another node's, a device not served now (FAILED_PRECONDITION)
├── ApiError              [dra/kube.py] the API server failed a request or is unreachable
│   │                     (UNAVAILABLE; its HTTP status is ``http_status``)
│   └── VersionGone       the resource.k8s.io version is no longer served: found again
└── NameCollision         [dra/slices.py] two device IDs of a pool meet in one DRA device name
                          (INTERNAL)

``grpc_status`` below is the device plugin API's one boundary. DRA answers a failed claim with an
error string in the claim's response, as its protocol does, not with a gRPC status: that one
boundary is ClaimPreparer._each (dra/preparer.py), which answers every ShimError (and OSError)
as ``str(error)``.
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


class DeviceHeld(ShimError):
    """A device of a resource served through both the device plugin API and DRA, asked for
    through one while the other holds it (core/holds.py)."""

    status = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, resource: str, device_id: str, holder: str, wanted_by: str) -> None:
        super().__init__(
            f"{resource}: device {device_id!r} is held by {holder}; {wanted_by} cannot have it until "
            'it is freed (docs/dra.md, "Both APIs at once")'
        )
        self.device_id = device_id
        self.holder = holder


class SourceUnavailable(ShimError):
    status = grpc.StatusCode.UNAVAILABLE


class SourceTimeout(ShimError):
    status = grpc.StatusCode.DEADLINE_EXCEEDED


class SourceFailed(ShimError):
    status = grpc.StatusCode.INTERNAL


class GrantRefused(ShimError):
    """A grant outside the resource's grant policy (shim/policy/): Allocate is refused."""

    status = grpc.StatusCode.PERMISSION_DENIED

    def __init__(self, resource: str, field: str, value: str, rule: str, kind: str) -> None:
        # A driver chose the value: cut it short, as gRPC details travel in an 8 KiB header block.
        self.shown = repr(value) if len(value) <= 200 else repr(value[:200]) + "..."
        super().__init__(f"{resource}: grant policy refuses {field} {self.shown}: {rule}")
        self.field = field  # where in the grant, e.g. 'mounts[1].host_path'
        self.value = value
        self.rule = rule
        self.kind = kind  # the field without index or key, a bounded metric label


class ClaimRefused(ShimError):
    """A driver declared a resource it may not serve: another source's, or one outside its
    ``drivers[].resources``. ``holder`` is the owner's description, None where nobody owns it."""

    def __init__(self, message: str, holder: str | None) -> None:
        super().__init__(message)
        self.holder = holder


class SpecsRefused(ShimError):
    """A driver ships CDI specs devshim may not write (no ``cdi_dir`` configured): its start fails."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class ListTooLarge(ShimError):
    """A device list the kubelet could not receive (over its gRPC message limit): not sent."""

    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class ListNotEncodable(ShimError):
    """A device list the kubelet's messages cannot carry (a value past every validation): not sent."""

    status = grpc.StatusCode.INTERNAL


# A status message travels in the HTTP/2 trailers, percent-encoded (up to 12 bytes a character),
# and clients cap their size: grpc C-core at 8 KiB (soft) and 16 KiB (hard). An error echoing a
# 100 kB device ID from the request would reach such a caller as RESOURCE_EXHAUSTED instead of
# its real status (found by tests/fuzz), so messages are cut to this many characters.
MAX_STATUS_MESSAGE_CHARS = 512


def grpc_status(error: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a gRPC handler answers with for ``error``; the only such mapping."""
    if isinstance(error, ShimError):
        return error.status, _bounded(str(error))
    return grpc.StatusCode.INTERNAL, _bounded(f"internal error: {type(error).__name__}: {error}")


def _bounded(message: str) -> str:
    if len(message) <= MAX_STATUS_MESSAGE_CHARS:
        return message
    cut = MAX_STATUS_MESSAGE_CHARS - 40  # room for the note, so the result stays within the cap
    return f"{message[:cut]}... ({len(message) - cut:,} more characters)"

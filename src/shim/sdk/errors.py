"""The errors a driver raises to answer a request with a JSON-RPC error object.

They are RemoteErrors, so the peer turns them into error objects as they are;
devshim maps each code to the gRPC status the kubelet sees
(docs/driver-protocol.md, "Errors").
"""

from __future__ import annotations

from shim.jsonrpc import ErrorCode, RemoteError


class DriverError(RemoteError):
    """Answer the current request with ``code`` and ``message``.

    Use ErrorCode's protocol codes where one fits (UNAVAILABLE for "busy, try
    again"); any other code reaches the kubelet as INTERNAL.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(int(code), message)


class UnknownDevice(DriverError):
    def __init__(self, resource: str, device_id: str) -> None:
        super().__init__(ErrorCode.UNKNOWN_DEVICE, f"{resource}: unknown device '{device_id}'")


class UnknownResource(DriverError):
    def __init__(self, resource: str) -> None:
        super().__init__(ErrorCode.UNKNOWN_RESOURCE, f"unknown resource '{resource}'")


class NotImplementedByResource(DriverError):
    """An optional method the resource does not offer; devshim treats the capability as absent."""

    def __init__(self, resource: str, method: str) -> None:
        super().__init__(ErrorCode.METHOD_NOT_FOUND, f"{resource} does not implement {method}")


class InvalidParams(DriverError):
    def __init__(self, method: str, reason: str) -> None:
        super().__init__(ErrorCode.INVALID_PARAMS, f"invalid {method} params: {reason}")

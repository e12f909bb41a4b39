"""JSON-RPC error codes of the driver protocol, and the exceptions that carry them."""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ErrorCode(IntEnum):
    # JSON-RPC 2.0's own.
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    # The driver protocol's (docs/driver-protocol.md, "Errors").
    UNKNOWN_DEVICE = -32001
    DEVICE_UNHEALTHY = -32002
    UNKNOWN_RESOURCE = -32003
    UNAVAILABLE = -32004


class RemoteError(Exception):
    """An error object: raised by a handler to answer with it, or by a request that got one."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error

    def __str__(self) -> str:
        return f"{self.message} (JSON-RPC error {self.code})"


class ProtocolError(Exception):
    """The peer broke the framing or JSON-RPC itself: the connection cannot be trusted."""


class ConnectionClosed(Exception):
    """The connection ended while a request waited for its answer."""

"""Go's spelling of the values that end up inside the kubelet's error messages.

The kubelet builds its messages with fmt (%q, %v) from Go values and gRPC status errors; a plugin
sees these texts (in a Register error or a NotifyRegistrationStatus), so the fake spells them the
same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import grpc

# google.golang.org/grpc/codes code_string.go: CamelCase names, with Go's "Canceled".
_GO_CODE_NAMES = {grpc.StatusCode.CANCELLED: "Canceled", grpc.StatusCode.OK: "OK"}


def go_code(code: grpc.StatusCode) -> str:
    """codes.Code.String(): DEADLINE_EXCEEDED -> DeadlineExceeded."""
    return _GO_CODE_NAMES.get(code) or "".join(part.capitalize() for part in code.name.split("_"))


def go_rpc_error(err: grpc.aio.AioRpcError) -> str:
    """The text of a grpc-go client's error for this failed call (status.Error(...).Error())."""
    details = err.details() or ""
    if err.code() is grpc.StatusCode.DEADLINE_EXCEEDED and details == "Deadline Exceeded":
        # grpc-go reports its own client-side deadline as the context's error.
        details = "context deadline exceeded"
    return f"rpc error: code = {go_code(err.code())} desc = {details}"


def go_quote(value: str) -> str:
    """fmt's %q for a string (strconv.Quote), close enough for printable text."""
    return json.dumps(value, ensure_ascii=False)


def go_strings(values: Sequence[str]) -> str:
    """fmt's %v for a []string: [a b c]."""
    return "[" + " ".join(values) + "]"


def go_quote_strings(values: Sequence[str]) -> str:
    """fmt's %q for a []string or [N]string: each element quoted, space-separated, in brackets."""
    return "[" + " ".join(go_quote(value) for value in values) + "]"

"""JSON-RPC 2.0, one message per line: framing, bookkeeping and a symmetric peer.

Used by devshim's driver host and by the driver SDK alike.
"""

from shim.jsonrpc.errors import ConnectionClosed, ErrorCode, RemoteError
from shim.jsonrpc.framing import MAX_LINE_BYTES, StreamTransport, Transport
from shim.jsonrpc.peer import Peer

__all__ = [
    "MAX_LINE_BYTES",
    "ConnectionClosed",
    "ErrorCode",
    "Peer",
    "RemoteError",
    "StreamTransport",
    "Transport",
]

"""The DevicePlugin service of one API version, as the gRPC server sees it.

Built from the version's descriptor, so every method it declares is served: not the generated
``add_DevicePluginServicer_to_server``, for two reasons. A method may answer with bytes already
encoded (ListAndWatch lists and Allocate responses are kept encoded, shim/deviceplugin/encoded.py),
which the serializer passes through; and each unary method is wrapped once, here, in the
metrics and log context of shim/ops/rpc.py rather than through a per-call interceptor.
"""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

import grpc

from shim.ops import rpc


class InFlight:
    """The unary calls being answered, so that a closing server can let them finish first."""

    def __init__(self) -> None:
        self._calls: set[asyncio.Task[Any]] = set()

    def tracked(self, behavior: rpc.Unary) -> rpc.Unary:
        async def call(request: Any, context: rpc.Context) -> Any:
            task = asyncio.current_task()
            assert task is not None
            self._calls.add(task)
            try:
                return await behavior(request, context)
            finally:
                self._calls.discard(task)

        return call

    def now(self) -> list[asyncio.Task[Any]]:
        """The calls being answered now."""
        return list(self._calls)


def _serialize(response: Any) -> bytes:
    return response if isinstance(response, bytes) else bytes(response.SerializeToString())


def add(
    server: grpc.aio.Server, pb: ModuleType, servicer: Any, resource: str, version: str, calls: InFlight
) -> None:
    """Serve ``servicer``'s methods as the DevicePlugin service of ``pb``'s version; unary methods
    are counted and timed under ``resource`` and ``version``, and tracked in ``calls``.

    Registered by name too, as generated code does: grpc then finds the handler from the method
    path in C, instead of asking each generic handler of the server (both versions, health and
    reflection share one server) in Python on every call."""
    service = pb.DESCRIPTOR.services_by_name["DevicePlugin"]
    table: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        behavior = getattr(servicer, method.name)
        deserialize = getattr(pb, method.input_type.name).FromString
        if method.server_streaming:
            # Counted by the servicer as it opens (rpc.stream_opened): grpc.aio tells an async
            # generator handler by its function type, so it cannot be wrapped in a plain call.
            table[method.name] = grpc.unary_stream_rpc_method_handler(
                behavior, request_deserializer=deserialize, response_serializer=_serialize
            )
        else:
            table[method.name] = grpc.unary_unary_rpc_method_handler(
                rpc.timed(calls.tracked(behavior), resource, version, method.name),
                request_deserializer=deserialize,
                response_serializer=_serialize,
            )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, table),))
    # Not in grpc-stubs' Server yet (grpcio has it since 1.63).
    server.add_registered_method_handlers(service.full_name, table)  # type: ignore[attr-defined]

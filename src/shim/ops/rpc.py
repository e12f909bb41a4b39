"""Counts and times every kubelet-facing device-plugin RPC, with the status code the kubelet got,
and binds the API version to the log lines the call writes.

A server interceptor, not code in each handler: it sees every version's DevicePlugin methods
(v1beta2's Deallocate and PostStopContainer too) and the final status, whichever way a
handler ended (``abort`` from errors.grpc_status, an unexpected exception, a deadline).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from loguru import logger

from shim.ops import metrics

if TYPE_CHECKING:
    _Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # generic in grpc-stubs only
    _Interceptor = grpc.aio.ServerInterceptor

_SERVICE = ".DevicePlugin/"  # "/v1beta1.DevicePlugin/Allocate": health and reflection are not counted


class RpcMetrics(_Interceptor):
    """One per served socket: ``resource`` labels the series of every version served there."""

    def __init__(self, resource: str) -> None:
        self._resource = resource
        # The wrapped handler per method: built once, not on every call (the hot path).
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        package, found, method = handler_call_details.method.lstrip("/").partition(_SERVICE)
        if handler is None or not found:
            return handler
        if handler.unary_stream is not None:
            # ListAndWatch: counted as it opens; its generator is left untouched, since how its
            # end is seen (devshim closing it or the kubelet) must not change.
            metrics.RPC_REQUESTS.labels(self._resource, package, method, "OK").inc()
            return handler
        if handler.unary_unary is None:
            return handler
        wrapped = self._wrapped.get(handler_call_details.method)
        if wrapped is None:
            wrapped = self._wrapped[handler_call_details.method] = grpc.unary_unary_rpc_method_handler(
                self._timed(handler.unary_unary, package, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return wrapped

    def _timed(self, behavior: Callable[..., Any], version: str, method: str) -> Callable[..., Any]:
        duration = metrics.RPC_DURATION.labels(self._resource, version, method)
        requests = functools.partial(metrics.RPC_REQUESTS.labels, self._resource, version, method)
        counters: dict[str, Any] = {}

        async def timed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            code = "UNKNOWN"  # what grpc answers for an exception that is not an abort
            try:
                with logger.contextualize(version=version):  # on every log line of the call
                    response = await behavior(request, context)
                code = _name(context.code()) or "OK"
                return response
            except asyncio.CancelledError:
                code = "DEADLINE_EXCEEDED" if context.time_remaining() == 0 else "CANCELLED"
                raise
            except BaseException:
                code = _name(context.code()) or code
                raise
            finally:
                counter = counters.get(code) or counters.setdefault(code, requests(code))
                counter.inc()
                duration.observe(time.perf_counter() - started)

        return timed


def _name(code: grpc.StatusCode | None) -> str:
    return code.name if code is not None else ""

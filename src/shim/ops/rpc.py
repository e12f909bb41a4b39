"""Counts and times every kubelet-facing device-plugin RPC, with the status code the kubelet got,
and binds the API version to the log lines the call writes.

Applied where each version's DevicePlugin handler table is built (shim/deviceplugin/service.py), so
every method of every version is covered (v1beta2's Deallocate and PostStopContainer too), and
the final status is seen whichever way a handler ended (``abort`` from errors.grpc_status, an
unexpected exception, a deadline). Not a gRPC server interceptor: grpc.aio runs an interceptor's
coroutine and a second handler lookup on every call, a measurable share of an Allocate.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from typing import Any

import grpc

from shim import logs
from shim.ops import metrics

Context = grpc.aio.ServicerContext[Any, Any]
Unary = Callable[[Any, Context], Coroutine[Any, Any, Any]]


def stream_opened(resource: str, version: str, method: str) -> None:
    """A server-streaming call (ListAndWatch) counts as it opens; how it ends is the stream's own
    business (devshim closing it, or the kubelet), so it is not wrapped."""
    metrics.rpc_requests(resource, version, method, "OK").inc()


def timed(behavior: Unary, resource: str, version: str, method: str) -> Unary:
    """``behavior`` counted by the code answered, timed, and with ``version`` on its log lines."""
    duration = metrics.rpc_duration(resource, version, method)
    requests = functools.partial(metrics.rpc_requests, resource, version, method)
    counters: dict[str, Any] = {}  # label lookups once per code, not per call

    async def call(request: Any, context: Context) -> Any:
        started = time.perf_counter()
        code = "UNKNOWN"  # what grpc answers for an exception that is not an abort
        bound = logs.API_VERSION.set(version)
        try:
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
            logs.API_VERSION.reset(bound)

    return call


def _name(code: grpc.StatusCode | None) -> str:
    return code.name if code is not None else ""

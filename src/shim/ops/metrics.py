"""One-line recorders for the places that instrument devshim, over its Prometheus series
(shim/ops/series.py) once they are enabled, and doing nothing before.

devshim enables them when its ops endpoint is on, the only place they are read (/metrics):
with ``http.enabled: false`` prometheus_client is never loaded (2.7 MB and 18 ms of a start,
docs/benchmarks.md). Enable before the Shim builds its handler tables: the RPC handlers take
their series' children once, when they are built.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

RestartReason = Literal["socket_removed", "kubelet_socket_recreated", "stream_ended", "watcher_refused"]


class Counted(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class Observed(Protocol):
    def observe(self, amount: float) -> None: ...


class _Off:
    """A series and its children while metrics are off: take every observation, keep none."""

    def labels(self, *values: str) -> _Off:
        return self

    def remove(self, *values: str) -> None:
        pass

    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


class _AllOff:
    def __getattr__(self, name: str) -> _Off:
        return _OFF


_OFF = _Off()
# shim.ops.series once enabled; until then every series is off.
_series: Any = _AllOff()


def enable() -> None:
    """Define the series (idempotent); from now on every recorder counts."""
    global _series
    if isinstance(_series, _AllOff):
        from shim.ops import series

        _series = series


def rpc_duration(resource: str, version: str, method: str) -> Observed:
    child: Observed = _series.RPC_DURATION.labels(resource, version, method)
    return child


def rpc_requests(resource: str, version: str, method: str, code: str) -> Counted:
    child: Counted = _series.RPC_REQUESTS.labels(resource, version, method, code)
    return child


_HEALTH = ("Healthy", "Unhealthy")
_negotiated: dict[str, str] = {}  # resource -> the version its gauge series is set for


def _outcome(ok: bool) -> str:
    return "ok" if ok else "failed"


def registration(resource: str, version: str, ok: bool) -> None:
    _series.REGISTRATIONS.labels(resource, version, _outcome(ok)).inc()


def negotiated(resource: str, version: str) -> None:
    """``version`` is now the one in use: its series is 1 and the previous one is gone."""
    previous = _negotiated.get(resource)
    if previous is not None and previous != version:
        _series.NEGOTIATED_VERSION.remove(resource, previous)
    _negotiated[resource] = version
    _series.NEGOTIATED_VERSION.labels(resource, version).set(1)


def endpoint_closed(resource: str) -> None:
    if (previous := _negotiated.pop(resource, None)) is not None:
        _series.NEGOTIATED_VERSION.remove(resource, previous)


def restart_noticed(resource: str, reason: RestartReason) -> None:
    _series.KUBELET_RESTARTS.labels(resource, reason).inc()


def devices(resource: str, healthy: int, unhealthy: int) -> None:
    _series.DEVICES.labels(resource, "Healthy").set(healthy)
    _series.DEVICES.labels(resource, "Unhealthy").set(unhealthy)


def resource_stopped(resource: str) -> None:
    for health in _HEALTH:
        _series.DEVICES.remove(resource, health)


def list_sent(resource: str, version: str) -> None:
    _series.LIST_MESSAGES.labels(resource, version).inc()


def list_too_large(resource: str) -> None:
    _series.LIST_TOO_LARGE.labels(resource).inc()


def list_encode_failed(resource: str) -> None:
    _series.LIST_ENCODE_FAILURES.labels(resource).inc()


def driver_restarted(driver: str) -> None:
    _series.DRIVER_RESTARTS.labels(driver).inc()


def driver_call(driver: str, method: str, ok: bool) -> None:
    _series.DRIVER_CALLS.labels(driver, method, _outcome(ok)).inc()


def policy_refused(resource: str, field: str) -> None:
    _series.POLICY_REFUSALS.labels(resource, field).inc()


def driver_claim_refused(driver: str, resource: str) -> None:
    _series.DRIVER_REFUSED_CLAIMS.labels(driver, resource).inc()


_dra_service: dict[tuple[str, str], str] = {}  # (driver, kind) -> the service its series is set for


def dra_call(driver: str, service: str, method: str, ok: bool) -> None:
    _series.DRA_CALLS.labels(driver, service, method, _outcome(ok)).inc()


def dra_service(driver: str, kind: Literal["plugin", "health"], service: str) -> None:
    """The kubelet called ``service`` (a registration string, v1.DRAPlugin): it is the one in use."""
    previous = _dra_service.get((driver, kind))
    if previous is not None and previous != service:
        _series.DRA_SERVICE.remove(driver, kind, previous)
    _dra_service[(driver, kind)] = service
    _series.DRA_SERVICE.labels(driver, kind, service).set(1)


def dra_prepared(driver: str, claims: int) -> None:
    _series.DRA_PREPARED.labels(driver).set(claims)

"""devshim's Prometheus metrics, and one-line recorders for the places that instrument them.

Everything lives on ``REGISTRY``, not the client's global default one, so /metrics shows
devshim's series only and tests can read them without interference. Label values are
bounded: resource and driver names come from settings or drivers, versions and methods
from devshim's own tables; device IDs never become labels.
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# No *_created series beside every counter: they double /metrics and nobody here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry()

RestartReason = Literal["socket_removed", "kubelet_socket_recreated", "stream_ended", "watcher_refused"]

REGISTRATIONS = Counter(
    "devshim_registrations_total",
    "Registrations with the kubelet: classic Register attempts and plugin-watcher statuses.",
    ["resource", "version", "outcome"],
    registry=REGISTRY,
)
NEGOTIATED_VERSION = Gauge(
    "devshim_negotiated_version_info",
    "1 for the device-plugin API version the kubelet registered the resource with.",
    ["resource", "version"],
    registry=REGISTRY,
)
DEVICES = Gauge(
    "devshim_devices",
    "Devices in the resource's latest list, by health.",
    ["resource", "health"],
    registry=REGISTRY,
)
RPC_REQUESTS = Counter(
    "devshim_rpc_requests_total",
    "Kubelet-facing device-plugin RPCs by the status code answered (ListAndWatch: streams opened).",
    ["resource", "version", "method", "code"],
    registry=REGISTRY,
)
RPC_DURATION = Histogram(
    "devshim_rpc_duration_seconds",
    "Time to answer a unary kubelet-facing device-plugin RPC.",
    ["resource", "version", "method"],
    # From a cached answer (sub-millisecond) to the kubelet's 30 s PreStartContainer deadline.
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
LIST_MESSAGES = Counter(
    "devshim_list_messages_total",
    "ListAndWatch messages (full device lists) sent to the kubelet.",
    ["resource", "version"],
    registry=REGISTRY,
)
LIST_TOO_LARGE = Counter(
    "devshim_list_too_large_total",
    "Device lists not sent because they exceed the kubelet's 4 MiB gRPC message limit (stream ended).",
    ["resource"],
    registry=REGISTRY,
)
LIST_ENCODE_FAILURES = Counter(
    "devshim_list_encode_failures_total",
    "Device lists not sent because they cannot be encoded for the kubelet (stream ended).",
    ["resource"],
    registry=REGISTRY,
)
KUBELET_RESTARTS = Counter(
    "devshim_kubelet_restarts_total",
    "Re-registration cycles an endpoint started, by what it noticed (mostly kubelet restarts).",
    ["resource", "reason"],
    registry=REGISTRY,
)
DRIVER_RESTARTS = Counter(
    "devshim_driver_restarts_total",
    "Driver runs that failed after starting (each restarted unless given up).",
    ["driver"],
    registry=REGISTRY,
)
DRIVER_CALLS = Counter(
    "devshim_driver_calls_total",
    "JSON-RPC requests devshim sent to a driver, by outcome.",
    ["driver", "method", "outcome"],
    registry=REGISTRY,
)
POLICY_REFUSALS = Counter(
    "devshim_policy_refusals_total",
    "Allocate calls refused because the source granted something outside the resource's grant policy.",
    # field: where in the grant, without index or key (mounts.host_path, envs): a bounded label.
    ["resource", "field"],
    registry=REGISTRY,
)
DRIVER_REFUSED_CLAIMS = Counter(
    "devshim_driver_refused_claims_total",
    "Resources a driver declared that devshim refused to serve for it: another source's (resource: its "
    "name), outside its drivers[].resources (resource: 'other' unless another source has it), or an "
    "invalid name (resource: 'invalid'). Driver-invented names never become labels.",
    ["driver", "resource"],
    registry=REGISTRY,
)

DRA_CALLS = Counter(
    "devshim_dra_calls_total",
    "Kubelet calls on a DRA driver's socket, by the service version the kubelet chose; each "
    "claim of a prepare or unprepare counted once, with its outcome.",
    ["driver", "service", "method", "outcome"],
    registry=REGISTRY,
)
DRA_SERVICE = Gauge(
    "devshim_dra_service_info",
    "1 for each DRA gRPC service version the kubelet last called on the driver's socket.",
    ["driver", "kind", "service"],
    registry=REGISTRY,
)
DRA_PREPARED = Gauge(
    "devshim_dra_prepared_claims",
    "Claims a DRA driver has prepared on this node and not yet unprepared.",
    ["driver"],
    registry=REGISTRY,
)

_HEALTH = ("Healthy", "Unhealthy")
_negotiated: dict[str, str] = {}  # resource -> the version its gauge series is set for


def _outcome(ok: bool) -> str:
    return "ok" if ok else "failed"


def registration(resource: str, version: str, ok: bool) -> None:
    REGISTRATIONS.labels(resource, version, _outcome(ok)).inc()


def negotiated(resource: str, version: str) -> None:
    """``version`` is now the one in use: its series is 1 and the previous one is gone."""
    previous = _negotiated.get(resource)
    if previous is not None and previous != version:
        NEGOTIATED_VERSION.remove(resource, previous)
    _negotiated[resource] = version
    NEGOTIATED_VERSION.labels(resource, version).set(1)


def endpoint_closed(resource: str) -> None:
    if (previous := _negotiated.pop(resource, None)) is not None:
        NEGOTIATED_VERSION.remove(resource, previous)


def restart_noticed(resource: str, reason: RestartReason) -> None:
    KUBELET_RESTARTS.labels(resource, reason).inc()


def devices(resource: str, healthy: int, unhealthy: int) -> None:
    DEVICES.labels(resource, "Healthy").set(healthy)
    DEVICES.labels(resource, "Unhealthy").set(unhealthy)


def resource_stopped(resource: str) -> None:
    for health in _HEALTH:
        DEVICES.remove(resource, health)


def list_sent(resource: str, version: str) -> None:
    LIST_MESSAGES.labels(resource, version).inc()


def list_too_large(resource: str) -> None:
    LIST_TOO_LARGE.labels(resource).inc()


def list_encode_failed(resource: str) -> None:
    LIST_ENCODE_FAILURES.labels(resource).inc()


def driver_restarted(driver: str) -> None:
    DRIVER_RESTARTS.labels(driver).inc()


def driver_call(driver: str, method: str, ok: bool) -> None:
    DRIVER_CALLS.labels(driver, method, _outcome(ok)).inc()


def policy_refused(resource: str, field: str) -> None:
    POLICY_REFUSALS.labels(resource, field).inc()


def driver_claim_refused(driver: str, resource: str) -> None:
    DRIVER_REFUSED_CLAIMS.labels(driver, resource).inc()


_dra_service: dict[tuple[str, str], str] = {}  # (driver, kind) -> the service its series is set for


def dra_call(driver: str, service: str, method: str, ok: bool) -> None:
    DRA_CALLS.labels(driver, service, method, _outcome(ok)).inc()


def dra_service(driver: str, kind: Literal["plugin", "health"], service: str) -> None:
    """The kubelet called ``service`` (a registration string, v1.DRAPlugin): it is the one in use."""
    previous = _dra_service.get((driver, kind))
    if previous is not None and previous != service:
        DRA_SERVICE.remove(driver, kind, previous)
    _dra_service[(driver, kind)] = service
    DRA_SERVICE.labels(driver, kind, service).set(1)


def dra_prepared(driver: str, claims: int) -> None:
    DRA_PREPARED.labels(driver).set(claims)

"""devshim's Prometheus series, defined when shim.ops.metrics is enabled (its docstring says when).

Everything lives on ``REGISTRY``, not the client's global default one, so /metrics shows
devshim's series only and tests can read them without interference. Label values are
bounded: resource and driver names come from settings or drivers, versions and methods
from devshim's own tables; device IDs never become labels.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# No *_created series beside every counter: they double /metrics and nobody here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry()


# Every series goes on REGISTRY: said once here rather than by a registry= in each definition.
def _counter(name: str, documentation: str, labels: list[str]) -> Counter:
    return Counter(name, documentation, labels, registry=REGISTRY)


def _gauge(name: str, documentation: str, labels: list[str]) -> Gauge:
    return Gauge(name, documentation, labels, registry=REGISTRY)


REGISTRATIONS = _counter(
    "devshim_registrations_total",
    "Registrations with the kubelet: classic Register attempts and plugin-watcher statuses.",
    ["resource", "version", "outcome"],
)
NEGOTIATED_VERSION = _gauge(
    "devshim_negotiated_version_info",
    "1 for the device-plugin API version the kubelet registered the resource with.",
    ["resource", "version"],
)
DEVICES = _gauge(
    "devshim_devices",
    "Devices in the resource's latest list, by health.",
    ["resource", "health"],
)
RPC_REQUESTS = _counter(
    "devshim_rpc_requests_total",
    "Kubelet-facing device-plugin RPCs by the status code answered (ListAndWatch: streams opened).",
    ["resource", "version", "method", "code"],
)
RPC_DURATION = Histogram(
    "devshim_rpc_duration_seconds",
    "Time to answer a unary kubelet-facing device-plugin RPC.",
    ["resource", "version", "method"],
    # From a cached answer (sub-millisecond) to the kubelet's 30 s PreStartContainer deadline.
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
LIST_MESSAGES = _counter(
    "devshim_list_messages_total",
    "ListAndWatch messages (full device lists) sent to the kubelet.",
    ["resource", "version"],
)
LIST_TOO_LARGE = _counter(
    "devshim_list_too_large_total",
    "Device lists not sent because they exceed the kubelet's 4 MiB gRPC message limit (stream ended).",
    ["resource"],
)
LIST_ENCODE_FAILURES = _counter(
    "devshim_list_encode_failures_total",
    "Device lists not sent because they cannot be encoded for the kubelet (stream ended).",
    ["resource"],
)
KUBELET_RESTARTS = _counter(
    "devshim_kubelet_restarts_total",
    "Re-registration cycles an endpoint started, by what it noticed (mostly kubelet restarts).",
    ["resource", "reason"],
)
DRIVER_RESTARTS = _counter(
    "devshim_driver_restarts_total",
    "Driver runs that failed after starting (each restarted unless given up).",
    ["driver"],
)
DRIVER_CALLS = _counter(
    "devshim_driver_calls_total",
    "JSON-RPC requests devshim sent to a driver, by outcome.",
    ["driver", "method", "outcome"],
)
POLICY_REFUSALS = _counter(
    "devshim_policy_refusals_total",
    "Allocate calls refused because the source granted something outside the resource's grant policy.",
    # field: where in the grant, without index or key (mounts.host_path, envs): a bounded label.
    ["resource", "field"],
)
DRIVER_REFUSED_CLAIMS = _counter(
    "devshim_driver_refused_claims_total",
    "Resources a driver declared that devshim refused to serve for it: another source's (resource: its "
    "name), outside its drivers[].resources (resource: 'other' unless another source has it), or an "
    "invalid name (resource: 'invalid'). Driver-invented names never become labels.",
    ["driver", "resource"],
)

DRA_CALLS = _counter(
    "devshim_dra_calls_total",
    "Kubelet calls on a DRA driver's socket, by the service version the kubelet chose; each "
    "claim of a prepare or unprepare counted once, with its outcome.",
    ["driver", "service", "method", "outcome"],
)
DRA_SERVICE = _gauge(
    "devshim_dra_service_info",
    "1 for each DRA gRPC service version the kubelet last called on the driver's socket.",
    ["driver", "kind", "service"],
)
DRA_PREPARED = _gauge(
    "devshim_dra_prepared_claims",
    "Claims a DRA driver has prepared on this node and not yet unprepared.",
    ["driver"],
)

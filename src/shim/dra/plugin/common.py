"""What every version of the kubelet's DRA gRPC services does, given that version's messages.

The version modules (v1.py, v1beta1.py, health_v1.py, health_v1alpha1.py) each import their own
generated stubs and hand them here: the DRAPlugin messages of v1beta1 and v1 have the same
fields (v1 adds ``share_id``, for shared devices devshim does not offer), and so do the two
DRAResourceHealth versions. Which version the kubelet chose shows in the log, /status and
/metrics (``devshim_dra_service_info``): the first call of each version says so.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from loguru import logger

from shim.dra.claims import ClaimRef
from shim.dra.health import TIMEOUT_S, PoolHealth
from shim.dra.preparer import ClaimPreparer, Outcome
from shim.ops import metrics

MAX_CLAIMS = 1024  # per call: far beyond a node's pods; more is not a kubelet talking


@dataclass
class PluginStatus:
    """One DRA driver's kubelet side, for /status."""

    driver: str
    socket: str
    registration_socket: str
    registered: bool | None = None  # None: the kubelet's plugin watcher has said nothing yet
    registration_error: str | None = None
    service: str | None = None  # the DRAPlugin version the kubelet last called
    health_service: str | None = None  # the DRAResourceHealth version of the last stream
    health_streams: int = 0
    prepared_claims: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None


class DraService:
    """The driver's preparer and pool health behind every version's servicer."""

    def __init__(self, preparer: ClaimPreparer, health: PoolHealth, status: PluginStatus) -> None:
        self.preparer = preparer
        self.health = health
        self.status = status
        status.prepared_claims = preparer.prepared()
        metrics.dra_prepared(status.driver, status.prepared_claims)

    def _observe(self, kind: Literal["plugin", "health"], service: str) -> None:
        seen = self.status.service if kind == "plugin" else self.status.health_service
        if seen != service:
            logger.info("DRA driver {}: the kubelet calls {}", self.status.driver, service)
            if kind == "plugin":
                self.status.service = service
            else:
                self.status.health_service = service
        metrics.dra_service(self.status.driver, kind, service)

    async def call(self, service: str, method: str, pb: Any, request: Any) -> Any:
        """NodePrepareResources or NodeUnprepareResources in ``pb``'s messages."""
        self._observe("plugin", service)
        claims = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims[:MAX_CLAIMS]]
        if method == "NodePrepareResources":
            outcomes = await self.preparer.prepare(claims)
        else:
            outcomes = await self.preparer.unprepare(claims)
        answered = {uid: _answer(pb, method, outcome) for uid, outcome in outcomes.items()}
        for uid in {c.uid for c in request.claims[MAX_CLAIMS:]}:  # named, so not "missing"
            answered[uid] = _answer(pb, method, Outcome(error=f"more than {MAX_CLAIMS} claims in one call"))
        self._count(service, method, outcomes.values())
        if method == "NodePrepareResources":
            return pb.NodePrepareResourcesResponse(claims=answered)
        return pb.NodeUnprepareResourcesResponse(claims=answered)

    def _count(self, service: str, method: str, outcomes: Iterable[Outcome]) -> None:
        for outcome in outcomes:
            metrics.dra_call(self.status.driver, service, method, not outcome.error)
            key = f"{method} {'ok' if not outcome.error else 'failed'}"
            self.status.calls[key] = self.status.calls.get(key, 0) + 1
            if outcome.error:
                self.status.last_error = outcome.error
        self.status.prepared_claims = self.preparer.prepared()
        metrics.dra_prepared(self.status.driver, self.status.prepared_claims)

    async def watch_health(self, service: str, pb: Any) -> AsyncIterator[Any]:
        """NodeWatchResources in ``pb``'s messages: the pool's health, again on every change."""
        self._observe("health", service)
        self.status.health_streams += 1
        pool = self.preparer.pool
        try:
            async for report in self.health.reports():
                now = int(time.time())
                yield pb.NodeWatchResourcesResponse(
                    devices=[
                        pb.DeviceHealth(
                            device=pb.DeviceIdentifier(pool_name=pool, device_name=d.device),
                            health=pb.HEALTHY if d.healthy else pb.UNHEALTHY,
                            last_updated_time=now,
                            health_check_timeout_seconds=TIMEOUT_S,
                        )
                        for d in report
                    ]
                )
        finally:
            self.status.health_streams -= 1


def _answer(pb: Any, method: str, outcome: Outcome) -> Any:
    if method == "NodeUnprepareResources":
        return pb.NodeUnprepareResourceResponse(error=outcome.error)
    return pb.NodePrepareResourceResponse(
        devices=[
            pb.Device(
                request_names=list(d.request_names),
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=list(d.cdi_device_ids),
            )
            for d in outcome.devices
        ],
        error=outcome.error,
    )

"""What every version of the kubelet's DRA gRPC services does, given that version's messages.

The version modules (v1.py, v1beta1.py, health_v1.py, health_v1alpha1.py) each import their own
generated stubs and subclass a servicer here with them, as the device-plugin front end's do:
the DRAPlugin messages of v1beta1 and v1 have the same fields (v1 adds ``share_id``, for shared
devices devshim does not offer), and so do the two DRAResourceHealth versions. Which version the
kubelet chose shows in the log, /status and /metrics (``devshim_dra_service_info``): the first
call of each version says so.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import grpc
from loguru import logger

from shim.dra.claims import ClaimRef
from shim.dra.health import TIMEOUT_S, PoolHealth
from shim.dra.preparer import ClaimPreparer, Outcome
from shim.ops import metrics

MAX_CLAIMS = 1024  # per call: far beyond a node's pods; more is not a kubelet talking
_PREPARE, _UNPREPARE = "NodePrepareResources", "NodeUnprepareResources"  # as metrics label them
Context = grpc.aio.ServicerContext[Any, Any]
Run = Callable[[list[ClaimRef]], Awaitable[dict[str, Outcome]]]


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

    async def prepare(self, service: str, pb: ModuleType, request: Any) -> Any:
        """NodePrepareResources in ``pb``'s messages."""
        answers = await self._answer(service, _PREPARE, self.preparer.prepare, request)
        return pb.NodePrepareResourcesResponse(claims={uid: _prepared(pb, o) for uid, o in answers.items()})

    async def unprepare(self, service: str, pb: ModuleType, request: Any) -> Any:
        """NodeUnprepareResources in ``pb``'s messages."""
        answers = await self._answer(service, _UNPREPARE, self.preparer.unprepare, request)
        return pb.NodeUnprepareResourcesResponse(
            claims={uid: pb.NodeUnprepareResourceResponse(error=o.error) for uid, o in answers.items()}
        )

    async def _answer(
        self,
        service: str,
        method: str,
        run: Callable[[list[ClaimRef]], Awaitable[dict[str, Outcome]]],
        request: Any,
    ) -> dict[str, Outcome]:
        self._observe("plugin", service)
        claims = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims[:MAX_CLAIMS]]
        outcomes = await run(claims)
        self._count(service, method, outcomes.values())
        over = Outcome(error=f"more than {MAX_CLAIMS} claims in one call")
        return outcomes | {c.uid: over for c in request.claims[MAX_CLAIMS:]}  # named, so not "missing"

    def _count(self, service: str, method: str, outcomes: Iterable[Outcome]) -> None:
        for outcome in outcomes:
            metrics.dra_call(self.status.driver, service, method, not outcome.error)
            key = f"{method} {'ok' if not outcome.error else 'failed'}"
            self.status.calls[key] = self.status.calls.get(key, 0) + 1
            if outcome.error:
                self.status.last_error = outcome.error
        self.status.prepared_claims = self.preparer.prepared()
        metrics.dra_prepared(self.status.driver, self.status.prepared_claims)

    async def watch_health(self, service: str, pb: ModuleType) -> AsyncIterator[Any]:
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


def _has_share_id(pb: ModuleType) -> bool:
    """Whether this version's Device has share_id (v1 has, v1beta1 has not)."""
    return "share_id" in pb.Device.DESCRIPTOR.fields_by_name


def _prepared(pb: ModuleType, outcome: Outcome) -> Any:
    return pb.NodePrepareResourceResponse(
        devices=[
            pb.Device(
                request_names=list(d.request_names),
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=list(d.cdi_device_ids),
                **({"share_id": d.share_id} if d.share_id is not None and _has_share_id(pb) else {}),
            )
            for d in outcome.devices
        ],
        error=outcome.error,
    )


# --- the servicers: each version module subclasses one with its generated base and messages ---


class PluginServicer:
    """DRAPlugin, in the messages (``pb``) of the version module that subclasses it."""

    pb: ModuleType
    version: str  # what the plugin watcher's supported versions call it ("v1.DRAPlugin")

    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodePrepareResources(self, request: Any, context: Context) -> Any:
        return await self._service.prepare(self.version, self.pb, request)

    async def NodeUnprepareResources(self, request: Any, context: Context) -> Any:
        return await self._service.unprepare(self.version, self.pb, request)


class HealthServicer:
    """DRAResourceHealth, in the messages (``pb``) of the version module that subclasses it."""

    pb: ModuleType
    version: str  # "v1.DRAResourceHealth"

    def __init__(self, service: DraService) -> None:
        self._service = service

    async def NodeWatchResources(self, request: Any, context: Context) -> AsyncIterator[Any]:
        async for report in self._service.watch_health(self.version, self.pb):
            yield report


@dataclass(frozen=True)
class Version:
    """One version of one of the kubelet's DRA services, as its version module declares it."""

    servicer: type[PluginServicer] | type[HealthServicer]
    add_to_server: Callable[[Any, grpc.aio.Server], None]  # the generated add_*Servicer_to_server

    @property
    def name(self) -> str:
        return self.servicer.version

    def add(self, server: grpc.aio.Server, service: DraService) -> None:
        self.add_to_server(self.servicer(service), server)

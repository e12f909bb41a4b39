"""The kubelet's side of the soak: the fake kubelet with a hook on its sessions, and a PodResources
service that faults can take away or throttle on its own (FakeKubelet's built-in one goes only
with the whole kubelet)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.compat.fakekubelet import podresources as podresources_wire
from shim.compat.fakekubelet.ratelimit import DEFAULT_BURST, DEFAULT_QPS, TokenBucket
from shim.compat.fakekubelet.records import DeviceState, Grant, RunningPod


class RecordingKubelet(FakeKubelet):
    """The fake kubelet, handing every session it attaches to `on_session`.

    The list checker must see every ListAndWatch list the kubelet receives, including those of a
    session replaced a moment after it began; polling `plugin()` could miss such a session, so
    the soak hooks the one place every session (classic or watcher path) comes from.
    """

    def __init__(self, *args: Any, on_session: Callable[[PluginSession], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_session = on_session
        # Every grant an Allocate answered, with its resource: what reached the container runtime.
        self.grants: list[tuple[str, Grant]] = []

    async def _attach(self, *args: Any, **kwargs: Any) -> PluginSession:
        session = await super()._attach(*args, **kwargs)
        self.on_session(session)
        answered = session.allocate_containers

        async def allocate_containers(containers: Sequence[Sequence[str]]) -> list[Grant]:
            grants = await answered(containers)
            self.grants.extend((session.resource, grant) for grant in grants)
            return grants

        session.allocate_containers = allocate_containers  # type: ignore[method-assign]
        return session


class PodResources:
    """The kubelet's PodResources service (api.PodResourcesProvider), which faults can take away
    or throttle. It reports the fake kubelet's pods, and restarts with the kubelet."""

    def __init__(self, socket_path: Path, kubelet: FakeKubelet, resources: Sequence[str]) -> None:
        self.socket_path = socket_path
        self._kubelet = kubelet
        self._resources = resources
        self._server: grpc.aio.Server | None = None
        self._limiter = TokenBucket(DEFAULT_QPS, DEFAULT_BURST)
        self.calls = 0
        self.rejected = 0
        self.last_answered = 0.0  # time.monotonic() of the last call admitted past the limiter

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        # A new kubelet process starts with a full bucket (ratelimit.go).
        self._limiter = TokenBucket(DEFAULT_QPS, DEFAULT_BURST)
        self._server = await podresources_wire.serve(self.socket_path, self)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)
        self.socket_path.unlink(missing_ok=True)

    def throttle(self, qps: float, burst: int) -> None:
        self._limiter = TokenBucket(qps, burst)

    def unthrottle(self) -> None:
        self._limiter = TokenBucket(DEFAULT_QPS, DEFAULT_BURST)

    # -- api.PodResourcesProvider --------------------------------------------------------------

    def admit_call(self) -> bool:
        self.calls += 1
        allowed = self._limiter.allow()
        self.rejected += not allowed
        if allowed:
            self.last_answered = time.monotonic()
        return allowed

    def running_pods(self) -> list[RunningPod]:
        return self._kubelet.pods

    def allocatable_devices(self) -> Mapping[str, Sequence[DeviceState]]:
        found: dict[str, tuple[DeviceState, ...]] = {}
        for resource in self._resources:
            with contextlib.suppress(KeyError):
                session = self._kubelet.plugin(resource)
                if session.lists and not session.stream_ended.is_set():
                    found[resource] = tuple(d for d in session.latest if d.healthy)
        return found

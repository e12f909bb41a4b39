"""Pods on the fake node: device admission for their containers, and what PodResources reports.

Admission follows pkg/kubelet/cm/devicemanager/manager.go: Allocate is called for every container
at pod admission, init containers first and in order, then app containers; PreStartContainer
follows when each container starts (GetDeviceRunContainerOptions). A pod's finished init
containers lend their devices to the later containers of the same pod (devicesToReuse). The
table also answers the PodResources service (api.PodResourcesProvider).

With a v1beta2 plugin the table also makes the two calls KEP-3162 proposed (kubernetes/enhancements
#3080, closed unmerged; its design: "Add `PostStopContainer` as a container lifecycle hook. Add
`Deallocate` calls in container manager, taking care to only do so for devices that are no longer
in the reuse list"): PostStopContainer when a container stops (an init container once it has run,
the app containers at end_pod), then Deallocate once the pod's devices are free again (end_pod, or
a failed admission, Deallocate being "the opposite of Allocate"). Each only when the plugin's
options ask for it, and to the resource's current session (skipped when its stream has ended,
where the kubelet would get errEndpointStopped and only log it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from .errors import AdmissionRejected, FakeKubeletError
from .ratelimit import TokenBucket
from .records import AssignedDevice, ContainerSpec, DeviceState, PodContainer, RunningPod
from .session import PluginSession

PodKey = tuple[str, str]  # (namespace, name)


@dataclass
class _Pod:
    spec: RunningPod
    # The devices the pod holds, per session that handed them out (released once, at the end).
    held: dict[PluginSession, list[str]] = field(default_factory=dict)


class PodTable:
    """The running pods, their devices, and the PodResources view of them.

    `sessions` is the kubelet's current session per resource. The table outlives a kubelet
    restart (the pods keep running and the kubelet's checkpoint remembers their devices).
    """

    def __init__(
        self, sessions: Callable[[], Mapping[str, PluginSession]], rate: tuple[float, int] | None
    ) -> None:
        self.calls = 0
        self._sessions = sessions
        self._rate = rate
        self._limiter = TokenBucket(*rate) if rate is not None else None
        self._pods: dict[PodKey, _Pod] = {}
        # The kubelet admits one pod at a time (its pod admission handlers run serially).
        self._lock = asyncio.Lock()

    def restarted(self) -> None:
        """A new kubelet process: a new rate limiter, with a full bucket."""
        self._limiter = TokenBucket(*self._rate) if self._rate is not None else None

    @property
    def pods(self) -> list[RunningPod]:
        return [pod.spec for pod in self._pods.values()]

    async def run(
        self, namespace: str, name: str, containers: Sequence[ContainerSpec]
    ) -> dict[str, list[str]]:
        """Admit and start a pod; container name -> its device ids. Raises and holds nothing if
        admission fails (AdmissionRejected, EndpointStopped or the plugin's AioRpcError); devices
        already Allocated are then Deallocated where the plugin asks for it, errors ignored (the
        admission's own error is the one raised)."""
        _check(containers)
        async with self._lock:
            if (namespace, name) in self._pods:
                raise ValueError(f"pod {namespace}/{name} is already running")
            pod = _Pod(RunningPod(namespace, name))
            try:
                started = await self._admit(pod, containers)
                # manager.go callPreStartContainerIfNeeded runs as each container starts: the init
                # containers one after the other (each stopped before the next starts), then the
                # app containers.
                for container, session in started:
                    if session is not None and session.options.pre_start_required:
                        await session.prestart(container.device_ids)
                    if session is not None and container.init:
                        await self._post_stop(container)
            except Exception:
                with contextlib.suppress(grpc.aio.AioRpcError, FakeKubeletError):
                    await self._deallocate(pod)
                _release(pod)
                raise
            except BaseException:  # cancelled: no more calls to the plugin
                _release(pod)
                raise
            by_name = {container.name: container for container, _ in started}
            pod.spec = RunningPod(namespace, name, tuple(by_name[spec.name] for spec in containers))
            self._pods[(namespace, name)] = pod
        return {spec.name: by_name[spec.name].device_ids for spec in containers}

    async def _admit(
        self, pod: _Pod, containers: Sequence[ContainerSpec]
    ) -> list[tuple[PodContainer, PluginSession | None]]:
        # manager.go Allocate: the caller loops through init containers before app containers.
        order = [spec for spec in containers if spec.init] + [spec for spec in containers if not spec.init]
        reusable: dict[str, list[str]] = {}  # manager.go devicesToReuse, per resource
        started: list[tuple[PodContainer, PluginSession | None]] = []
        for spec in order:
            if spec.count == 0:
                started.append((PodContainer(spec.name, (), spec.init), None))
                continue
            session = self._session(spec.resource)
            ids, _ = await session.allocate_devices(spec.count, reuse=reusable.get(spec.resource, ()))
            held = pod.held.setdefault(session, [])
            held += [device for device in ids if device not in held]
            numa = {device.id: device.numa_nodes for device in (session.lists[-1] if session.lists else ())}
            devices = tuple(AssignedDevice(spec.resource, device, numa.get(device, ())) for device in ids)
            started.append((PodContainer(spec.name, devices, spec.init), session))
            pool = reusable.setdefault(spec.resource, [])
            if spec.init:
                # A (non-restartable) init container's devices may be reused by later containers:
                # podDevices.addContainerAllocatedResources.
                pool += [device for device in ids if device not in pool]
            else:
                # An app container keeps its devices: podDevices.removeContainerAllocatedResources.
                pool[:] = [device for device in pool if device not in ids]
        return started

    def _session(self, resource: str) -> PluginSession:
        session = self._sessions().get(resource)
        if session is None:
            # manager.go devicesToAllocate's message for a resource no plugin registered.
            raise AdmissionRejected(f"cannot allocate unregistered device {resource}")
        return session

    async def end(self, namespace: str, name: str) -> None:
        """The pod terminated: it leaves PodResources and its devices are free again.

        PostStopContainer and Deallocate (v1beta2) come first; an error of either propagates, the
        later calls skipped, once the pod is gone and its devices are free in the kubelet's books.
        """
        async with self._lock:
            pod = self._pods.pop((namespace, name), None)
            if pod is None:
                raise KeyError(f"no running pod {namespace}/{name}")
            try:
                for container in pod.spec.containers:
                    if container.devices and not container.init:  # init containers stopped already
                        await self._post_stop(container)
                await self._deallocate(pod)
            finally:
                # manager.go UpdateAllocatedDevices drops the devices of pods no longer active.
                _release(pod)

    def _current(self, resource: str) -> PluginSession | None:
        session = self._sessions().get(resource)
        return None if session is None or session.stream_ended.is_set() else session

    async def _post_stop(self, container: PodContainer) -> None:
        """KEP-3162's PostStopContainer hook for a stopped container (its devices: one resource)."""
        session = self._current(container.devices[0].resource) if container.devices else None
        if session is not None and session.wants_post_stop:
            await session.post_stop(container.device_ids)

    async def _deallocate(self, pod: _Pod) -> None:
        """Deallocate every device the pod held, one call per resource."""
        by_resource: dict[str, list[str]] = {}
        for holder, device_ids in pod.held.items():
            ids = by_resource.setdefault(holder.resource, [])
            ids += [device for device in device_ids if device not in ids]
        for resource, ids in by_resource.items():
            session = self._current(resource)
            if ids and session is not None and session.wants_deallocate:
                await session.deallocate(ids)

    # -- api.PodResourcesProvider ----------------------------------------------------------------

    def admit_call(self) -> bool:
        self.calls += 1
        return self._limiter is None or self._limiter.allow()

    def running_pods(self) -> list[RunningPod]:
        return self.pods

    def allocatable_devices(self) -> dict[str, tuple[DeviceState, ...]]:
        # manager.go GetAllocatableDevices: every known device that is healthy. A plugin whose
        # stream ended has had all its devices marked unhealthy (PluginDisconnected).
        return {
            resource: tuple(device for device in session.lists[-1] if device.healthy)
            for resource, session in self._sessions().items()
            if session.lists and not session.stream_ended.is_set()
        }


def _check(containers: Sequence[ContainerSpec]) -> None:
    names = [spec.name for spec in containers]
    if len(set(names)) != len(names):
        raise ValueError(f"container names must be unique within a pod: {names}")
    for spec in containers:
        if spec.count < 0:
            raise ValueError(f"container {spec.name!r}: count must not be negative, not {spec.count}")


def _release(pod: _Pod) -> None:
    for session, device_ids in pod.held.items():
        # Every session of a resource shares the kubelet's allocated set, so releasing through
        # the session that handed the devices out is right even after it was replaced.
        session.release([device for device in device_ids if device in session.in_use])
    pod.held.clear()

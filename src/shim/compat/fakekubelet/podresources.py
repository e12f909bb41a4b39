"""The fake kubelet's PodResources v1 wire: the only module of it that imports those stubs.

The kubelet serves PodResourcesLister on /var/lib/kubelet/pod-resources/kubelet.sock
(pkg/kubelet/apis/podresources/server_v1.go); device plugins and monitoring agents read it to
learn which devices running containers hold. This module translates the fake kubelet's records to
and from that API: the service (fed by an api.PodResourcesProvider) and a small reader that tests
use to call it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from shim.generated.podresources.v1 import api_pb2, api_pb2_grpc

from .api import PodResourcesProvider
from .ratelimit import LIMIT_EXCEEDED
from .records import AssignedDevice, DeviceState, PodContainer, RunningPod

_Context = grpc.aio.ServicerContext[Any, Any]

# -- translation (pure) ---------------------------------------------------------------------------


def _entries(resource: str, device_id: str, numa_nodes: Sequence[int]) -> list[api_pb2.ContainerDevices]:
    # cm/container_manager_linux.go containerDevicesFromResourceDeviceInstances: one ContainerDevices
    # per device and NUMA node, each naming one device; a device without topology gets one entry
    # without it.
    if not numa_nodes:
        return [api_pb2.ContainerDevices(resource_name=resource, device_ids=[device_id])]
    return [
        api_pb2.ContainerDevices(
            resource_name=resource,
            device_ids=[device_id],
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=node)]),
        )
        for node in numa_nodes
    ]


def devices_to_proto(devices: Iterable[AssignedDevice]) -> list[api_pb2.ContainerDevices]:
    return [entry for d in devices for entry in _entries(d.resource, d.id, d.numa_nodes)]


def pod_to_proto(pod: RunningPod) -> api_pb2.PodResources:
    # server_v1.go List/Get: the spec's app containers (after any restartable init containers,
    # which the fake does not model); regular init containers are never listed.
    containers = [
        api_pb2.ContainerResources(name=c.name, devices=devices_to_proto(c.devices))
        for c in pod.containers
        if not c.init
    ]
    return api_pb2.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)


def allocatable_to_proto(
    devices: Mapping[str, Sequence[DeviceState]],
) -> api_pb2.AllocatableResourcesResponse:
    entries = [
        e for res, states in devices.items() for d in states for e in _entries(res, d.id, d.numa_nodes)
    ]
    return api_pb2.AllocatableResourcesResponse(devices=entries)


def devices_from_proto(entries: Iterable[api_pb2.ContainerDevices]) -> tuple[AssignedDevice, ...]:
    return tuple(
        AssignedDevice(entry.resource_name, device_id, tuple(node.ID for node in entry.topology.nodes))
        for entry in entries
        for device_id in entry.device_ids
    )


def pod_from_proto(message: api_pb2.PodResources) -> RunningPod:
    containers = tuple(PodContainer(c.name, devices_from_proto(c.devices)) for c in message.containers)
    return RunningPod(message.namespace, message.name, containers)


# -- the kubelet side -----------------------------------------------------------------------------


class _PodResourcesServicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, provider: PodResourcesProvider) -> None:
        self._provider = provider

    async def _admit(self, context: _Context) -> None:
        # grpc/ratelimit.go LimiterUnaryServerInterceptor: rejected before the handler runs.
        if not self._provider.admit_call():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, LIMIT_EXCEEDED)

    async def List(
        self, request: api_pb2.ListPodResourcesRequest, context: _Context
    ) -> api_pb2.ListPodResourcesResponse:
        await self._admit(context)
        pods = [pod_to_proto(pod) for pod in self._provider.running_pods()]
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)

    async def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: _Context
    ) -> api_pb2.AllocatableResourcesResponse:
        await self._admit(context)
        return allocatable_to_proto(self._provider.allocatable_devices())

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: _Context
    ) -> api_pb2.GetPodResourcesResponse:
        await self._admit(context)
        for pod in self._provider.running_pods():
            if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=pod_to_proto(pod))
        # server_v1.go Get returns a plain fmt.Errorf, which grpc-go sends as status Unknown.
        await context.abort(
            grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
        )


async def serve(socket_path: Path, provider: PodResourcesProvider) -> grpc.aio.Server:
    """Serve PodResourcesLister v1 on `socket_path` (replacing a stale socket); the started server."""
    # kubelet server.go ListenAndServePodResources: util.CreateListener makes the directory and
    # removes a leftover socket before listening.
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    socket_path.unlink(missing_ok=True)
    server = grpc.aio.server()
    servicer = _PodResourcesServicer(provider)
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix:{socket_path}")
    await server.start()
    return server


# -- a reader of the service (what a plugin or monitoring agent does), for tests ------------------


class PodResourcesReader:
    """Calls a PodResourcesLister v1 service; failures propagate as grpc.aio.AioRpcError.

    Containers come back with init=False: the API does not say which containers were init ones.
    """

    def __init__(self, socket_path: Path) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix:{socket_path}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]

    async def list(self, timeout: float = 5.0) -> list[RunningPod]:
        response = await self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
        return [pod_from_proto(pod) for pod in response.pod_resources]

    async def get(self, namespace: str, name: str, timeout: float = 5.0) -> RunningPod:
        request = api_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        response = await self._stub.Get(request, timeout=timeout)
        return pod_from_proto(response.pod_resources)

    async def allocatable(self, timeout: float = 5.0) -> tuple[AssignedDevice, ...]:
        response = await self._stub.GetAllocatableResources(
            api_pb2.AllocatableResourcesRequest(), timeout=timeout
        )
        return devices_from_proto(response.devices)

    async def close(self) -> None:
        await self._channel.close(None)

    async def __aenter__(self) -> PodResourcesReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

"""The kubelet's side of one registered plugin: its device lists and the calls made to it.

One PluginSession exists per successful Register, like the kubelet's endpoint
(pkg/kubelet/cm/devicemanager/endpoint.go); connect.py makes it. It is version-neutral: the wire
is behind a PluginClient (api.py), and the KEP-3162 calls behind a LifecycleClient.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import grpc

from shim.facts import KUBELET_PRESTART_DEADLINE_S

from .admission import available_devices, take_preferred
from .api import LifecycleClient, PluginClient, PreferredRequest
from .errors import EndpointStopped, ProtocolViolation
from .records import DeviceState, Grant, PluginOptions

DeviceList = tuple[DeviceState, ...]

CLOSED = "closed by the kubelet"


class PluginSession:
    """One plugin as the kubelet sees it after a successful Register.

    `version` is the API version the kubelet speaks to it; `options` come from
    GetDevicePluginOptions. `lists` holds every ListAndWatch message in order. Once the stream is
    over `stream_ended` is set and `stream_error` says why: None when the plugin ended it with OK,
    "CODE: details" for a gRPC status, "closed by the kubelet" when the kubelet stopped,
    deregistered the plugin or the plugin registered again.
    """

    def __init__(
        self,
        resource: str,
        endpoint: str,
        options: PluginOptions,
        client: PluginClient,
        *,
        version: str,
        rpc_timeout_s: float = 10.0,
        allocated: set[str] | None = None,
    ) -> None:
        self.resource = resource
        self.endpoint = endpoint
        self.version = version
        self.options = options
        self.lists: list[DeviceList] = []
        self.stream_ended = asyncio.Event()
        self.stream_error: str | None = None
        self._client = client
        self._rpc_timeout_s = rpc_timeout_s
        self._changed = asyncio.Condition()
        self._watch_task: asyncio.Task[None] | None = None
        self._close_reason = CLOSED
        # manager.go keeps allocatedDevices per resource, not per endpoint: the kubelet passes one
        # set that every session of the resource shares (and that outlives a kubelet restart, as
        # the checkpoint does).
        self._in_use: set[str] = allocated if allocated is not None else set()
        # The kubelet admits pods one at a time; this keeps concurrent admit() calls from
        # choosing the same devices while a GetPreferredAllocation call is in flight.
        self._admission = asyncio.Lock()

    def __repr__(self) -> str:
        state = "ended" if self.stream_ended.is_set() else "watching"
        lists = f"{len(self.lists)} lists, {state}"
        return f"<PluginSession {self.resource} at {self.endpoint} ({self.version}): {lists}>"

    # -- the ListAndWatch stream ---------------------------------------------------------------

    def start(self) -> None:
        """Open ListAndWatch in the background (client.go Run, started by handler.go connectClient)."""
        self._watch_task = asyncio.create_task(self._watch(), name=f"ListAndWatch {self.resource}")

    async def close(self, why: str = CLOSED) -> None:
        """End the stream and close the channel (endpoint stop / client.go Disconnect); `why`
        becomes the stream_error."""
        self._close_reason = why
        if self._watch_task is None and not self.stream_ended.is_set():  # closed before it started
            self.stream_error = why
            self.stream_ended.set()
        if self._watch_task is not None and not self._watch_task.done():
            self._watch_task.cancel()
            # asyncio.wait, not `await task`: a cancellation of the caller must still propagate.
            await asyncio.wait([self._watch_task])
        await self._client.close()

    async def _watch(self) -> None:
        try:
            async for devices in self._client.list_and_watch():
                self.lists.append(devices)
                await self._notify()
        except grpc.aio.AioRpcError as err:
            self.stream_error = f"{err.code().name}: {err.details()}"
        except asyncio.CancelledError:
            self.stream_error = self._close_reason
            raise
        except Exception as err:  # a translation bug must not vanish into an unretrieved task
            self.stream_error = f"fake kubelet failed reading the stream: {err!r}"
        finally:
            # client.go Run returns on any stream end, then handler.go runClient disconnects the
            # client: the channel is closed and the endpoint stops (manager.go PluginDisconnected
            # marks every device unhealthy), until the plugin registers again.
            self.stream_ended.set()
            await self._client.close()
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    @property
    def latest(self) -> DeviceList:
        """The newest device list; LookupError before the first one arrives."""
        if not self.lists:
            raise LookupError(f"{self.resource}: no ListAndWatch message received yet")
        return self.lists[-1]

    async def wait_for_list(
        self, predicate: Callable[[DeviceList], bool] = lambda devices: True, *, timeout: float = 10.0
    ) -> DeviceList:
        """The newest list if it satisfies `predicate`, else the first later list that does."""
        next_index = max(len(self.lists) - 1, 0)
        found: DeviceList | None = None

        def settled() -> bool:
            nonlocal next_index, found
            for devices in self.lists[next_index:]:
                if predicate(devices):
                    found = devices
                    return True
            next_index = len(self.lists)
            return self.stream_ended.is_set()

        async with self._changed:
            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(settled)
            except TimeoutError:
                raise TimeoutError(f"{self.resource}: no matching list within {timeout}s; {self}") from None
        if found is None:
            raise EndpointStopped(f"{self.resource}: ListAndWatch ended ({self.stream_error}) first")
        return found

    # -- calls to the plugin ---------------------------------------------------------------------

    def _ensure_running(self) -> None:
        # endpoint.go allocate/preStartContainer/getPreferredAllocation: errEndpointStopped.
        if self.stream_ended.is_set():
            raise EndpointStopped(f"endpoint {self.resource} at {self.endpoint} has been stopped")

    async def allocate(self, device_ids: Sequence[str]) -> Grant:
        """Allocate for one container, as the kubelet always does (endpoint.go allocate)."""
        (grant,) = await self.allocate_containers([device_ids])
        return grant

    async def allocate_containers(self, containers: Sequence[Sequence[str]]) -> list[Grant]:
        """One Allocate call with one container request per item; checks one response each."""
        self._ensure_running()
        grants = await self._client.allocate(containers, self._rpc_timeout_s)
        # manager.go allocateContainerResources only rejects an empty response; api.proto's
        # contract is one ContainerAllocateResponse per ContainerAllocateRequest, checked here.
        if len(grants) != len(containers):
            raise ProtocolViolation(
                f"{self.resource}: Allocate with {len(containers)} container requests "
                f"got {len(grants)} container responses"
            )
        return grants

    async def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """GetPreferredAllocation for one container; the plugin's preferred device ids."""
        # manager.go callGetPreferredAllocationIfAvailable: only when the plugin's options say so.
        if not self.options.get_preferred_allocation_available:
            raise ProtocolViolation(f"{self.resource}: options do not offer GetPreferredAllocation")
        self._ensure_running()
        request = PreferredRequest(tuple(available), tuple(must_include), size)
        answers = await self._client.preferred_allocation([request], self._rpc_timeout_s)
        if len(answers) != 1:
            raise ProtocolViolation(
                f"{self.resource}: GetPreferredAllocation for 1 container got {len(answers)} responses"
            )
        return list(answers[0])

    async def prestart(self, device_ids: Sequence[str]) -> None:
        """PreStartContainer, with the kubelet's fixed 30 s deadline (endpoint.go)."""
        # manager.go callPreStartContainerIfNeeded: only when options.pre_start_required.
        if not self.options.pre_start_required:
            raise ProtocolViolation(f"{self.resource}: options do not ask for PreStartContainer")
        self._ensure_running()
        await self._client.prestart(device_ids, KUBELET_PRESTART_DEADLINE_S)

    # KEP-3162 (kubernetes/enhancements#3080, closed unmerged) gave neither call a deadline; the
    # fake uses its usual RPC timeout for both.

    @property
    def wants_post_stop(self) -> bool:
        """Its API version has PostStopContainer and its options ask for it."""
        return isinstance(self._client, LifecycleClient) and self.options.post_stop_container_required

    @property
    def wants_deallocate(self) -> bool:
        """Its API version has Deallocate and its options offer it."""
        return isinstance(self._client, LifecycleClient) and self.options.deallocate_available

    async def post_stop(self, device_ids: Sequence[str]) -> None:
        """PostStopContainer (v1beta2 only): a container that used `device_ids` has stopped."""
        client = self._lifecycle("PostStopContainer", self.options.post_stop_container_required)
        await client.post_stop(device_ids, self._rpc_timeout_s)

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        """Deallocate (v1beta2 only): `device_ids` are free again.

        release() never calls it: release() is the kubelet's bookkeeping, which must not fail or
        wait on the plugin; PodTable calls Deallocate where devices leave a pod (end_pod, or a
        failed admission), and a test using admit() and release() calls it itself.
        """
        client = self._lifecycle("Deallocate", self.options.deallocate_available)
        await client.deallocate(device_ids, self._rpc_timeout_s)

    def _lifecycle(self, rpc: str, offered: bool) -> LifecycleClient:
        # Like manager.go's calls guarded by an options flag: only in a version that has the RPC,
        # and only when the plugin's options ask for it.
        if not isinstance(self._client, LifecycleClient):
            raise ProtocolViolation(f"{self.resource}: API {self.version} has no {rpc}")
        if not offered:
            raise ProtocolViolation(f"{self.resource}: options do not ask for {rpc}")
        self._ensure_running()
        return self._client

    # -- pod admission ------------------------------------------------------------------------------

    @property
    def in_use(self) -> frozenset[str]:
        """Device ids handed out by admit() and not yet released."""
        return frozenset(self._in_use)

    async def admit(self, count: int) -> tuple[list[str], Grant]:
        """Admit a one-container pod asking for `count` devices, then start it, like the kubelet.

        Chooses among Healthy devices of the latest list not in use, consulting
        GetPreferredAllocation when offered, calls Allocate, then PreStartContainer when required.
        A failed Allocate frees the devices again; a failed PreStartContainer does not (the pod
        keeps its devices and the kubelet would retry the container start).
        """
        chosen, grant = await self.allocate_devices(count)
        if self.options.pre_start_required:
            await self.prestart(chosen)
        return chosen, grant

    async def allocate_devices(self, count: int, *, reuse: Sequence[str] = ()) -> tuple[list[str], Grant]:
        """Choose `count` devices for one container and Allocate them: the admission half of admit().

        `reuse`: devices of the pod's finished init containers (in use already), which manager.go
        devicesToAllocate takes first; Allocate then names them again with the newly chosen ones."""
        if count <= 0:
            raise ValueError(f"count must be positive, not {count}")
        if not self._in_use.issuperset(reuse):
            raise ValueError(
                f"{self.resource}: devices to reuse are not in use: "
                f"{', '.join(sorted(set(reuse) - self._in_use))}"
            )
        async with self._admission:
            reused = list(dict.fromkeys(reuse))[:count]
            chosen = await self._choose(count, reused)
            fresh = chosen[len(reused) :]
            # manager.go devicesToAllocate marks devices allocated before the Allocate RPC and
            # allocateContainerResources restores the previous state if it fails.
            self._in_use.update(fresh)
            try:
                grant = await self.allocate(chosen)
            except BaseException:
                self._in_use.difference_update(fresh)
                raise
        return chosen, grant

    def release(self, device_ids: Sequence[str]) -> None:
        """Return devices from a finished pod (the kubelet's UpdateAllocatedDevices)."""
        unknown = set(device_ids) - self._in_use
        if unknown:
            raise ValueError(f"{self.resource}: not in use: {', '.join(sorted(unknown))}")
        self._in_use.difference_update(device_ids)

    async def _choose(self, count: int, reused: list[str]) -> list[str]:
        self._ensure_running()
        needed = count - len(reused)
        latest = self.lists[-1] if self.lists else ()
        # The health checks come first, even for a full reuse.
        available = available_devices(self.resource, latest, self._in_use, needed)
        if needed == 0:
            return reused
        if not self.options.get_preferred_allocation_available:
            return [*reused, *available[:needed]]
        # manager.go devicesToAllocate: ask with the available and reused devices, the reused ones
        # as must-include and size = the whole request.
        preferred = await self.preferred_allocation([*reused, *available], reused, count)
        return [*reused, *take_preferred(available, preferred, needed)]

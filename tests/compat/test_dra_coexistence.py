"""Both APIs at once (docs/dra.md, "Both APIs at once"; core/holds.py), judged by the real
kubelet: its device manager and its DRA manager of one release side by side on one node, each
with its own view of devshim, which serves the sim's three GPUs through both.

The device manager takes the devices through devshim's device plugin socket (registered on its
kubelet.sock) and serves PodResources, which devshim's Deallocate emulation reads; the DRA
manager prepares claims through devshim's DRA socket from the real API server, where devshim
publishes the pool. The test allocates claims as the scheduler would, from the published pool.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from shim.compat.dra_world import RunningDevshim
from shim.compat.fakekubelet.v1beta1 import PluginClientV1Beta1
from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases as upstream
from shim.compat.upstream.dra_manager import (
    Container,
    ContainerClaim,
    DraManager,
    DraManagerError,
    Pod,
    PodClaim,
    running_dra_manager,
)
from shim.compat.upstream.harness import Container as DpContainer
from shim.compat.upstream.harness import Harness, HarnessError, running_harness
from shim.compat.upstream.harness import Pod as DpPod
from shim.driverprotocol import quantity_value
from tests.support import control_plane
from tests.support.dra import GPU_DRIVER, Published, config, make_claim, running
from tests.support.dra_judge import CLAIMS_VERSION, RELEASES, build, param
from tests.support.unix import short_temp_dir
from tests.support.waiting import until

GPU = "example.com/gpu"
SIM_GPUS: dict[str, Any] = {
    "name": GPU,
    "devices": [{"id": f"gpu-{i}", "numa_nodes": [0]} for i in range(3)],
    "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
    "deallocate": True,
}


@pytest.fixture(scope="module", params=[param(r, (RELEASES[-1],)) for r in RELEASES])
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    release: upstream.Release = request.param
    build(release)
    upstream.build(release, log=False)
    with control_plane.running(release, "ds-both-cp-") as plane:
        yield plane


class Node:
    """devshim, the release's device manager and DRA manager, on one node's folders."""

    def __init__(self, plane: ControlPlane, name: str, folder: Path, stack: AsyncExitStack) -> None:
        self.plane, self.name, self.folder, self.stack = plane, name, folder, stack
        plane.ensure("/api/v1/nodes", {"metadata": {"name": name}})
        self.published = Published(plane, control_plane.NEWEST_DRA[plane.minor], name)
        self.devshim: RunningDevshim
        self.devices: Harness
        self.dra: DraManager

    async def start_devshim(self) -> None:
        self.devshim = await self.stack.enter_async_context(running(self.folder / "devshim.yaml"))

    async def kill_and_start_devshim(self) -> None:
        """devshim SIGKILLed and started again: it keeps nothing of what it saw but its state
        dir (the DRA checkpoint)."""
        await self.devshim.kill()
        await self.start_devshim()

    async def allocatable(self) -> list[str]:
        """The device manager's allocatable devices (its healthy ones)."""
        return sorted(d["id"] for d in (await self.devices.allocatable()).get(GPU, []))

    async def claim(self, name: str, devices: list[str]) -> Pod:
        """A claim allocated ``devices`` as the scheduler would, reserved for a new pod."""
        pod = Pod(
            uid=str(uuid.uuid4()),
            name=f"pod-{name}",
            resource_claims=[PodClaim(name, resource_claim_name=name)],
            containers=[Container("c0", [ContainerClaim(name)])],
        )
        results = [(f"r{i}", d) for i, d in enumerate(devices)]
        make_claim(
            self.plane,
            CLAIMS_VERSION[self.plane.minor],
            name,
            results,
            node=self.name,
            pods=[(pod.name, pod.uid)],
        )
        return pod

    def generation(self) -> int:
        return max(int(s["spec"]["pool"]["generation"]) for s in self.published.slices())

    async def until_restarted(self) -> None:
        """Until this devshim has compared its pool with the published one (and written any
        difference) and the DRA manager has registered it."""

        def compared(status: dict[str, Any]) -> bool:
            pool = status["dra"][GPU_DRIVER]
            return bool(pool["rounds"] >= 1 and pool["kubelet"]["registered"] is True)

        await self.devshim.status(compared, "devshim compared its pool and is registered again")

    async def until_held(self, wanted: dict[str, list[str]]) -> None:
        await self.devshim.status(lambda s: s["resources"][GPU]["held"] == wanted, f"devshim holds {wanted}")

    async def status(self) -> dict[str, Any]:
        return await self.devshim.status(lambda s: True, "devshim serves /status")

    async def allocate_directly(self, device_ids: list[str]) -> None:
        """A v1beta1 Allocate on devshim's device plugin socket, as a kubelet whose view is late."""
        client = PluginClientV1Beta1(Path((await self.status())["resources"][GPU]["socket"]))
        try:
            await client.connect()
            await client.allocate([device_ids], timeout=10)
        finally:
            await client.close()


async def start_node(
    stack: AsyncExitStack,
    plane: ControlPlane,
    folder: Path,
    *,
    device_plugin: bool = True,
    sim: dict[str, Any] = SIM_GPUS,
) -> Node:
    name = "node-both" if device_plugin else "node-dra-only"
    path = config(folder, plane, name, sim)
    settings = yaml.safe_load(path.read_text())
    settings["dra"]["drivers"][0]["device_plugin"] = device_plugin
    # PodResources as the device manager serves it, read often: a device a container freed goes
    # back to the DRA pool soon after.
    settings["deallocation"] = {
        "pod_resources_socket": str(folder / "pod-resources" / "kubelet.sock"),
        "poll_interval_s": 0.2,
        "grace_s": 0,
    }
    path.write_text(yaml.safe_dump(settings))
    for sub in ("dp", "registry", "dra-state", "pod-resources"):
        (folder / sub).mkdir(exist_ok=True)
    node = Node(plane, name, folder, stack)
    release = plane.release
    node.devices = await stack.enter_async_context(
        running_harness(release, release.binary(), folder / "dp", folder / "devicemanager.log")
    )
    await node.devices.start(pod_resources_socket=folder / "pod-resources" / "kubelet.sock")
    await node.start_devshim()
    node.dra = await stack.enter_async_context(
        running_dra_manager(release, build(release), folder / "dramanager.log")
    )
    await node.dra.start(
        plane.admin_kubeconfig, name, folder / "dra-state", folder / "registry", [folder / "cdi"]
    )
    await node.dra.registered(GPU_DRIVER)
    ids = sorted(d["id"] for d in sim["devices"])
    if device_plugin:
        await until_allocatable(node, ids)
    await node.published.until(lambda pool: len(pool) == len(ids), "the whole pool is published")
    return node


async def until_allocatable(node: Node, wanted: list[str], timeout: float = 30) -> None:
    """Until the device manager's healthy devices are ``wanted`` (a ListAndWatch update away)."""
    last: list[str] = []
    try:
        async with asyncio.timeout(timeout):
            while (last := await node.allocatable()) != wanted:
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"the device manager's allocatable devices are {last}, not {wanted}") from None


@asynccontextmanager
async def running_node(
    plane: ControlPlane, *, device_plugin: bool, sim: dict[str, Any] = SIM_GPUS
) -> AsyncIterator[Node]:
    with short_temp_dir("ds-both-") as folder:
        async with AsyncExitStack() as stack:
            try:
                yield await start_node(stack, plane, folder, device_plugin=device_plugin, sim=sim)
            except BaseException:
                for log in ("devshim.log", "devicemanager.log", "dramanager.log"):
                    text = (folder / log).read_text(errors="replace") if (folder / log).exists() else ""
                    print(f"--- {log}, the end:\n{text[-4000:]}")
                raise


@pytest.fixture
async def node(plane: ControlPlane) -> AsyncIterator[Node]:
    """A node whose pool is served through both APIs."""
    async with running_node(plane, device_plugin=True) as node:
        yield node


@pytest.fixture
async def dra_only_node(plane: ControlPlane) -> AsyncIterator[Node]:
    """A node whose pool is served through DRA alone."""
    async with running_node(plane, device_plugin=False) as node:
        yield node


async def test_each_api_is_withdrawn_what_the_other_holds_and_a_racing_request_fails_naming_the_holder(
    node: Node,
) -> None:
    # DRA first: a claim of gpu-1, prepared by the DRA manager, is Unhealthy to the device manager.
    first = await node.claim("first", ["gpu-1"])
    await node.dra.prepare(first)
    await until_allocatable(node, ["gpu-0", "gpu-2"])
    # The device manager admits a pod of two GPUs from what is left, and none of three.
    legacy = DpPod(str(uuid.uuid4()), "legacy", [DpContainer("app", {GPU: 2})])
    got = await node.devices.admit(legacy)
    assert sorted(got["app"][GPU]) == ["gpu-0", "gpu-2"]
    with pytest.raises(HarnessError, match="unavailable"):
        await node.devices.admit(DpPod(str(uuid.uuid4()), "more", [DpContainer("app", {GPU: 1})]))
    # Its devices leave the published pool: the scheduler cannot pick them.
    await node.published.until(lambda pool: sorted(pool) == ["gpu-1"], "only gpu-1 is published")
    # The races, each API's request arriving before it saw the other's hold: the later fails,
    # naming the holder. A claim a scheduler allocated from the old pool:
    late = await node.claim("late", ["gpu-0"])
    with pytest.raises(DraManagerError, match="gpu-0' is held by a container through the device plugin API"):
        await node.dra.prepare(late)
    # devshim restarts with no record of the pod's Allocate: PodResources still lists its devices,
    # so they stay out of the pool (not a write: the same generation) and no claim gets them.
    generation = node.generation()
    await node.kill_and_start_devshim()
    await node.until_restarted()
    assert sorted(node.published.pool() or {}) == ["gpu-1"] and node.generation() == generation
    stale = await node.claim("stale", ["gpu-2"])
    with pytest.raises(DraManagerError, match=r"gpu-2' is held by a container .* \(listed by PodResources\)"):
        await node.dra.prepare(stale)
    # and a kubelet whose device list was behind asking for the claim's device:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await node.allocate_directly(["gpu-1"])
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "gpu-1' is held by claim default/first (" in str(refused.value.details())
    # The pod ends: the device manager no longer lists its devices in PodResources, devshim's
    # emulation frees them, and they are published again.
    await node.devices.remove_pod(legacy.uid)
    await node.published.until(lambda pool: len(pool) == 3, "gpu-0 and gpu-2 are published again")
    # The claim is unprepared: gpu-1 is the device manager's again.
    await node.dra.unprepare(first.uid)
    await until_allocatable(node, ["gpu-0", "gpu-1", "gpu-2"])
    await node.until_held({"dra": [], "device_plugin": []})


async def test_a_pool_served_through_dra_only_never_meets_the_device_manager(dra_only_node: Node) -> None:
    """The last stage of a migration (docs/dra.md, "From the device plugin to DRA"): the
    device manager never hears of the resource, so the node offers it to no container
    requesting it as an extended resource; claims are prepared as before."""
    node = dra_only_node
    first = await node.claim("only", ["gpu-1"])
    await node.dra.prepare(first)
    capacity = await node.devices.capacity()
    assert GPU not in capacity.capacity and GPU not in capacity.allocatable
    # The device manager allocates nothing of a resource no plugin registered (the kubelet's
    # admission refuses such a pod before it, the node's allocatable having none).
    got = await node.devices.admit(DpPod(str(uuid.uuid4()), "legacy", [DpContainer("app", {GPU: 1})]))
    assert GPU not in got.get("app", {}), got
    status = await node.status()
    assert status["resources"][GPU] == {
        "registered": None,
        "dra_only": True,
        "devices": {"Healthy": 3, "Unhealthy": 0},
    }
    assert status["ready"] == "every resource is registered"
    await node.dra.unprepare(first.uid)


# A GPU and its two halves, each consuming from the GPU's counter set, and a plain GPU.
HALF = {"counter_set": "gpu-0", "counters": {"memory": "40Gi"}}
PARTITIONED: dict[str, Any] = SIM_GPUS | {
    "devices": [
        {
            "id": "gpu-0",
            "counter_sets": [{"name": "gpu-0", "counters": {"memory": "80Gi"}}],
            "consumes_counters": [{"counter_set": "gpu-0", "counters": {"memory": "80Gi"}}],
        },
        {"id": "gpu-0-a", "consumes_counters": [HALF]},
        {"id": "gpu-0-b", "consumes_counters": [HALF]},
        {"id": "gpu-1"},
    ]
}
PARTITIONS_SINCE = 36  # the first release with 1.36's shape, which devshim publishes


async def test_counters_a_partition_takes_through_either_api_the_other_api_cannot_have(
    plane: ControlPlane,
) -> None:
    """The device plugin has no counters, DRA's scheduler counts only claims: devshim counts both
    (core/counters.py). A claim on one half takes the whole GPU from the device manager; a
    container on the other half takes its memory from the counter set DRA publishes; a claim on
    the whole GPU that the scheduler allocated from an older view is refused naming the set."""
    if plane.minor < PARTITIONS_SINCE:
        pytest.skip(f"partitionable devices are published from 1.{PARTITIONS_SINCE} on")
    async with running_node(plane, device_plugin=True, sim=PARTITIONED) as node:
        half = await node.claim("half", ["gpu-0-a"])
        await node.dra.prepare(half)
        await until_allocatable(node, ["gpu-0-b", "gpu-1"])  # gpu-0's counters are half taken
        legacy = DpPod(str(uuid.uuid4()), "legacy", [DpContainer("app", {GPU: 2})])
        got = await node.devices.admit(legacy)
        assert sorted(got["app"][GPU]) == ["gpu-0-b", "gpu-1"]

        def left() -> Fraction | None:
            """What gpu-0's counter set has of memory, as published."""
            shared = [c for s in node.published.slices() for c in s["spec"].get("sharedCounters") or ()]
            return quantity_value(shared[0]["counters"]["memory"]["value"]) if shared else None

        # The container's half leaves the pool, and its memory the published set.
        await node.published.until(lambda pool: sorted(pool) == ["gpu-0", "gpu-0-a"], "the held devices gone")
        await until(lambda: left() == 40 * 2**30, "gpu-0's set published less 40Gi", 30)
        whole = await node.claim("whole", ["gpu-0"])
        with pytest.raises(DraManagerError, match="which consume counter set gpu-0"):
            await node.dra.prepare(whole)
        await node.devices.remove_pod(legacy.uid)
        await until(lambda: left() == 80 * 2**30, "gpu-0's whole set published again", 30)
        await node.dra.unprepare(half.uid)
        await until_allocatable(node, ["gpu-0", "gpu-0-a", "gpu-0-b", "gpu-1"])

"""The driver matrix's rows as the kubelet's real device manager sees them.

The rows have the names of the fake kubelet's (driver_scenarios.py) and check the same promise,
through what ManagerImpl shows the kubelet: GetCapacity (devices counted, the allocatable ones,
resources removed), GetAllocatableDevices (the healthy devices with their NUMA nodes), Allocate during
admission (with GetPreferredAllocation), GetDeviceRunContainerOptions (PreStartContainer and
what the runtime gets), GetDevices and the checkpoint across kubelet restarts. What the model
sees and the manager cannot show (each ListAndWatch message, the options as sent) is checked
through its effect: a device counted, a call that reached the driver.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence

from shim.compat.fakekubelet.records import HEALTHY
from shim.compat.plain import devices, listing
from shim.compat.results import Failed, Skip, expect

from .harness import Container, Pod, checkpoint
from .releases import Release
from .world import JudgedWorld

Scenario = Callable[[JudgedWorld], Awaitable[None]]
# How long the manager must keep a resource active for "list_watch" (its stream stays open).
STREAM_OPEN_S = 0.5
RECOVERY_TIMEOUT_S = 15.0
# types.go endpointStopGracePeriod: how long a stopped endpoint's resource stays in GetCapacity.
REMOVAL_GRACE_S = 300.0
POLL_S = 0.05

Devices = list[tuple[str, str, tuple[int, ...]]]


def _healthy(devices: Devices) -> Devices:
    return [d for d in devices if d[1] == HEALTHY]


def _hints(preferred: Sequence[set[int]]) -> str:
    """Each hint's NUMA nodes: "0, 1; 1"; "none" for no hint."""
    return "; ".join(listing(sorted(nodes)) for nodes in preferred) or "none"


def _with(w: JudgedWorld, feature: str, what: str) -> list[str]:
    chosen = [r for r in w.resources if getattr(w.capabilities(r), feature)]
    if not chosen:
        raise Skip(f"the driver declares no resource with {what}")
    return chosen


def _pod(n: int, resource: str, count: int = 1) -> Pod:
    return Pod(f"judge-pod-{n}", f"p{n}", [Container("app", {resource: count})])


async def _until(what: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await what():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def _allocatable_until(
    w: JudgedWorld, resource: str, wanted: Callable[[Devices], bool], timeout_s: float = RECOVERY_TIMEOUT_S
) -> bool:
    """Until the manager's allocatable devices of `resource` are `wanted`; False if they are not
    within `timeout_s`."""

    async def now() -> bool:
        return wanted(await w.allocatable(resource))

    return await _until(now, timeout_s)


async def register(w: JudgedWorld) -> None:
    """Every resource registers by the mode's path and the manager counts every device the
    driver lists, the healthy ones as allocatable."""
    capacity = await w.kubelet.harness.capacity()
    for resource in w.resources:
        devices = await w.expected(resource)
        expect(
            capacity.capacity.get(resource) == len(devices),
            f"{resource}: capacity {capacity.capacity.get(resource)}, the driver lists {len(devices)}",
        )
        healthy = len(_healthy(devices))
        expect(
            capacity.allocatable.get(resource) == healthy,
            f"{resource}: allocatable {capacity.allocatable.get(resource)}, the driver has {healthy} Healthy",
        )
    for resource in w.resources:
        endpoint = w.shim.served[resource].endpoint
        if w.registration == "watcher":
            # The real plugin manager told devshim's registration server how it went.
            expect(
                endpoint.watcher_status == "registered",
                f"{resource}: the plugin watcher's word was {endpoint.watcher_status!r}",
            )
        else:
            # No release serves v1beta2: devshim must have settled on v1beta1.
            expect(
                endpoint.negotiated == "v1beta1", f"{resource}: registered speaking {endpoint.negotiated!r}"
            )


async def list_watch(w: JudgedWorld) -> None:
    """The manager holds the driver's Healthy devices (ids, NUMA nodes) as allocatable, still
    after a while (an ended ListAndWatch stream would leave none allocatable)."""
    await asyncio.sleep(STREAM_OPEN_S)  # a stream that ended would leave no device allocatable
    for resource in w.resources:
        want = [(i, h, n) for i, h, n in _healthy(await w.expected(resource))]
        got = await w.allocatable(resource)
        expect(
            got == want,
            f"{resource}: the manager's healthy devices ({devices(got)}) are not the driver's "
            f"({devices(want)})",
        )


async def health_change(w: JudgedWorld) -> None:
    """A device the driver reports Unhealthy (through --health-hook) leaves the allocatable
    devices while the capacity still counts it."""
    if w.driver.health_hook is None:
        raise Skip("no --health-hook given: devshim cannot make a driver report a health change")
    with_healthy = [r for r in w.resources if _healthy(await w.expected(r))]
    if not with_healthy:
        raise Skip("the driver lists no Healthy device")
    resource = with_healthy[0]
    count = len(await w.expected(resource))
    device = _healthy(await w.expected(resource))[-1][0]
    await w.run_health_hook(resource, device)

    if not await _allocatable_until(w, resource, lambda ds: device not in [d[0] for d in ds], 10):
        raise Failed(f"{resource}: {device} is still allocatable 10 s after the driver reported it Unhealthy")
    capacity = await w.kubelet.harness.capacity()
    expect(
        capacity.capacity.get(resource) == count,
        f"{resource}: capacity {capacity.capacity.get(resource)} after the health change, not {count}",
    )


async def allocate(w: JudgedWorld) -> None:
    """A pod asking one device of each resource is admitted: Allocate succeeds, the container
    holds one Healthy device of each, the checkpoint records it, the runtime gets options, and
    the topology hints for it lie on its devices' NUMA nodes."""
    resources = [r for r in w.resources if _healthy(await w.expected(r))]
    if not resources:
        raise Skip("the driver lists no Healthy device to allocate")
    pod = Pod("judge-pod-0", "p0", [Container("app", {r: 1 for r in resources})])
    got = (await w.kubelet.admit(pod))["app"]
    for resource in resources:
        healthy = [d[0] for d in _healthy(await w.expected(resource))]
        ids = got.get(resource, [])
        expect(
            len(ids) == 1 and ids[0] in healthy,
            f"{resource}: the container got {listing(ids)}, not one of {listing(healthy)}",
        )
    entries = checkpoint(w.kubelet.plugin_dir).get("Data", {}).get("PodDeviceEntries") or []
    recorded = {e.get("ResourceName") for e in entries if e.get("PodUID") == pod.uid}
    expect(
        recorded == set(resources),
        f"the checkpoint records {listing(sorted(recorded))} for the pod, not {listing(resources)}",
    )
    await w.kubelet.harness.run_options(pod.uid, "app")
    # The topology manager's view: hints for the devices the container holds, on their NUMA nodes.
    hints = await w.kubelet.harness.hints(pod.uid, "app")
    for resource in resources:
        nodes = {n for d in await w.expected(resource) if d[0] in got[resource] for n in d[2]}
        if not nodes:
            continue  # no NUMA affinity: the manager gives no hint for it
        preferred = [set(h["numa"]) for h in hints.get(resource, []) if h["preferred"]]
        expect(
            preferred == [nodes],
            f"{resource}: preferred topology hints on NUMA nodes {_hints(preferred)} for devices on NUMA "
            f"nodes {listing(sorted(nodes))}",
        )


async def preferred_allocation(w: JudgedWorld) -> None:
    """Admitting two devices asks the driver for its preference and allocates two distinct
    Healthy devices."""
    for n, resource in enumerate(_with(w, "preferred_allocation", "preferred allocation")):
        healthy = [d[0] for d in _healthy(await w.expected(resource))]
        if len(healthy) < 2:
            raise Skip(f"{resource}: fewer than 2 Healthy devices to choose between")
        before = w.calls_ok("preferred_allocation")
        ids = (await w.kubelet.admit(_pod(n, resource, 2)))["app"].get(resource, [])
        expect(
            len(set(ids)) == 2 and set(ids) <= set(healthy),
            f"{resource}: allocated {listing(ids)}, not 2 of {listing(healthy)}",
        )
        await w.wait_for_calls("preferred_allocation", before + 1)


async def prestart(w: JudgedWorld) -> None:
    """GetDeviceRunContainerOptions after admission calls PreStartContainer, which reaches the
    driver and succeeds."""
    for n, resource in enumerate(_with(w, "pre_start", "pre-start")):
        before = w.calls_ok("prestart")
        pod = _pod(n, resource)
        await w.kubelet.admit(pod)
        await w.kubelet.harness.run_options(pod.uid, "app")
        await w.wait_for_calls("prestart", before + 1)


async def deallocate(w: JudgedWorld) -> None:
    """A pod's devices, freed when it ends, reach the driver's deallocate exactly once, through
    devshim's emulation reading the kubelet's own PodResources server (v1beta1 has no
    Deallocate)."""
    resources = _with(w, "deallocate", "deallocate")
    before = w.calls_ok("deallocate")
    for n, resource in enumerate(resources):
        pod = _pod(n, resource)
        await w.kubelet.admit(pod)
        await w.kubelet.end_pod(pod.uid)
    await w.expect_deallocations(before, len(resources))


async def post_stop(w: JudgedWorld) -> None:
    """PostStopContainer exists only in v1beta2, which no kubelet release serves."""
    _with(w, "post_stop", "post-stop")
    raise Skip("v1beta1 has no PostStopContainer, and no kubelet release serves v1beta2")


async def _restart_into(w: JudgedWorld, release: Release) -> None:
    """Admit a pod, restart the kubelet as `release` on the same directory: every resource
    is counted again with every device, the pod's devices are still its own (the checkpoint
    read back), and the driver was not restarted."""
    pid = w.driver_pid()
    held: dict[str, list[str]] = {}
    resources = [r for r in w.resources if _healthy(await w.expected(r))]
    if resources:
        pod = Pod("judge-pod-kept", "kept", [Container("app", {r: 1 for r in resources})])
        held = (await w.kubelet.admit(pod))["app"]
    await w.kubelet.restart(release)
    for resource in w.resources:
        await w.registered(resource, RECOVERY_TIMEOUT_S)
    if held:
        after = await w.kubelet.harness.assigned("judge-pod-kept", "app")
        kept = {r: [d["id"] for d in devices] for r, devices in after.items()}
        expect(kept == held, f"after the restart the pod holds {kept}, before it held {held}")
    expect(w.driver_pid() == pid, "the driver was restarted")


async def kubelet_restart(w: JudgedWorld) -> None:
    """The kubelet restarts (this release's own cleanup of device-plugins/ and its checkpoint)."""
    await _restart_into(w, w.release)


def _step(w: JudgedWorld, up: bool) -> Release:
    built = sorted(w.kubelet.binaries)
    i = built.index(w.release) + (1 if up else -1)
    if not 0 <= i < len(built):
        raise Skip(f"no release {'newer' if up else 'older'} than {w.release.name} in this run")
    return built[i]


async def upgrade(w: JudgedWorld) -> None:
    """The kubelet is replaced by the next release this run built, on the same directory."""
    await _restart_into(w, _step(w, up=True))


async def downgrade(w: JudgedWorld) -> None:
    """The next release up is replaced by this one, on the same directory (the world starts one
    release up)."""
    await _restart_into(w, w.cell_release)


async def socket_removed(w: JudgedWorld) -> None:
    """Someone removes devshim's socket while the kubelet runs on: devshim serves afresh and
    registers again, and the manager ends up with every device active."""
    for resource in w.resources:
        want = _healthy(await w.expected(resource))
        w.shim.served[resource].endpoint.socket_path.unlink()
        await asyncio.sleep(STREAM_OPEN_S)  # time for a torn-down registration to show
        await w.registered(resource, RECOVERY_TIMEOUT_S)
        if not await _allocatable_until(w, resource, want.__eq__):
            raise Failed(f"{resource}: not back to {want} active within {RECOVERY_TIMEOUT_S:g} s")


async def resource_removed(w: JudgedWorld) -> None:
    """devshim withdraws a resource (as when its driver stops declaring it): the manager sees its
    endpoint stop (every device counted, none allocatable), and once its fixed 5-minute grace
    has passed, GetCapacity removes the resource. Long: run only when named."""
    resource = w.resources[0]
    count = len(await w.expected(resource))
    await w.shim.remove_resource(resource)
    if not await _allocatable_until(w, resource, lambda ds: not ds):
        raise Failed(f"{resource}: still allocatable {RECOVERY_TIMEOUT_S:g} s after devshim withdrew it")
    now = (await w.kubelet.harness.capacity()).capacity.get(resource)
    expect(
        now == count,
        f"{resource}: capacity {now} once withdrawn, not {count} (unhealthy until the grace ends)",
    )

    async def removed() -> bool:
        return resource not in (await w.kubelet.harness.capacity()).capacity

    if not await _until(removed, REMOVAL_GRACE_S + RECOVERY_TIMEOUT_S):
        raise Failed(
            f"{resource}: still counted {REMOVAL_GRACE_S + RECOVERY_TIMEOUT_S:g} s after it was withdrawn"
        )


async def driver_crash(w: JudgedWorld) -> None:
    """The driver is SIGKILLed: the manager keeps counting its devices but none is allocatable
    (none vanishes), and once devshim has restarted the driver, the same devices are back."""
    before = {r: await w.allocatable(r) for r in w.resources}
    counts = (await w.kubelet.harness.capacity()).capacity
    w.kill_driver()

    async def every(wanted: Callable[[str, Devices], bool]) -> bool:
        got = await w.kubelet.harness.allocatable()
        now = {r: sorted((d["id"], d["health"], tuple(d["numa"])) for d in got.get(r, [])) for r in before}
        return all(wanted(r, devices) for r, devices in now.items())

    if not await _until(lambda: every(lambda r, ds: not ds), RECOVERY_TIMEOUT_S):
        raise Failed("devices stayed allocatable after the driver was killed")
    now = (await w.kubelet.harness.capacity()).capacity
    for resource in before:
        expect(
            now.get(resource) == counts.get(resource),
            f"{resource}: capacity {now.get(resource)} in the outage, not {counts.get(resource)}",
        )
    if not await _until(lambda: every(lambda r, ds: ds == before[r]), RECOVERY_TIMEOUT_S):
        raise Failed(f"not back to {before} within {RECOVERY_TIMEOUT_S:g} s; the driver is {w.host.status}")


async def _any_allocatable(w: JudgedWorld, resource: str) -> bool:
    return bool(await w.allocatable(resource))


async def devshim_restart(w: JudgedWorld) -> None:
    """devshim stops as on SIGTERM and starts again with its state folder (the model's row): the
    manager counts every device again, and a pod admitted then gets PreStartContainer where the
    driver asks for it (the manager reads a plugin's options once, when it registers)."""
    await w.restart_devshim()
    await w.driver_up()
    for resource in w.resources:
        await w.registered(resource)
    for n, resource in enumerate(r for r in w.resources if w.capabilities(r).pre_start):
        # Restored from the inventory, its devices are Unhealthy until the driver lists them.
        if not await _until(functools.partial(_any_allocatable, w, resource), RECOVERY_TIMEOUT_S):
            raise Failed(f"{resource}: nothing allocatable {RECOVERY_TIMEOUT_S:g} s after devshim restarted")
        before = w.calls_ok("prestart")
        pod = _pod(100 + n, resource)
        await w.kubelet.admit(pod)
        await w.kubelet.harness.run_options(pod.uid, "app")
        await w.wait_for_calls("prestart", before + 1)


SCENARIOS: dict[str, Scenario] = {
    f.__name__: f
    for f in (register, list_watch, health_change, allocate, preferred_allocation, prestart, deallocate,
              post_stop, kubelet_restart, upgrade, downgrade, socket_removed, driver_crash,
              devshim_restart, resource_removed)
}  # fmt: skip
# Rows that take minutes (the manager's 5-minute grace): run only when named with --scenario,
# and in devshim's own suite only with --full-matrix.
LONG = ("resource_removed",)


def first_release(scenario: str, release: Release, built: Sequence[Release]) -> Release:
    """The release a cell's world starts with: a downgrade starts one release up."""
    if scenario != "downgrade":
        return release
    newer = [r for r in sorted(built) if r > release]
    if not newer:
        raise Skip(f"no release newer than {release.name} in this run to downgrade from")
    return newer[0]

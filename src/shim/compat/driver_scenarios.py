"""The rows of the driver matrix: what the kubelet must see of a driver behind devshim.

Each scenario is an async function of a fresh DriverWorld (driver_world.py) that returns when the
kubelet saw what it should, raises Failed saying what it saw instead, or raises Skip when the
driver does not use the feature (a resource without pre-start has no pre-start row to pass). It
checks every resource the driver serves. tests/compat/test_matrix.py and `devshim compat` run
these same functions; docs/compat.md describes each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from shim.compat.fakekubelet.records import HEALTHY, UNHEALTHY, ContainerSpec, DeviceState, Grant

from .cdi_resolve import advice, unresolved
from .driver_world import CDI_FOLDER, START_TIMEOUT_S, DriverWorld, ids, restart_kubelet
from .modes import Kubelet
from .plain import devices as plain_devices
from .plain import flags, listing
from .plain import health as plain_health
from .results import Failed, Skip, expect

Scenario = Callable[[DriverWorld], Awaitable[str | None]]
# How long a stream must stay open for "list_watch" (the kubelet treats its end as a disconnect).
STREAM_OPEN_S = 0.5
RECOVERY_TIMEOUT_S = 15.0


def _healthy(devices: tuple[DeviceState, ...]) -> list[str]:
    return [d.id for d in devices if d.health == HEALTHY]


def _with(w: DriverWorld, feature: str, what: str) -> list[str]:
    chosen = [r for r in w.resources if getattr(w.capabilities(r), feature)]
    if not chosen:
        raise Skip(f"the driver declares no resource with {what}")
    return chosen


async def register(w: DriverWorld) -> None:
    """Every resource registers by the mode's path, speaking the newest version the kubelet has,
    and the options the kubelet reads (from Register or GetDevicePluginOptions, by profile) match
    what the driver declared."""
    for resource in w.resources:
        record = await w.kubelet.wait_for_registration(resource)
        expect(record.path == w.mode.registration, f"{resource}: registered by {record.path}")
        caps, options = w.capabilities(resource), w.session(resource).options
        wanted = {"pre_start_required": caps.pre_start,
                  "get_preferred_allocation_available": caps.preferred_allocation}  # fmt: skip
        if w.session(resource).version == "v1beta2":
            wanted |= {
                "deallocate_available": caps.deallocate,
                "post_stop_container_required": caps.post_stop,
            }
        seen = {name: getattr(options, name) for name in wanted}
        expect(
            seen == wanted,
            f"{resource}: the kubelet got options {flags(seen)}; the driver declared {flags(wanted)}",
        )


async def list_watch(w: DriverWorld) -> None:
    """ListAndWatch sends full lists (what the driver lists now, exact health strings, no repeated
    ID) and keeps the stream open."""
    await asyncio.sleep(STREAM_OPEN_S)
    for resource in w.resources:
        session = w.session(resource)
        expect(not session.stream_ended.is_set(), f"{resource}: ListAndWatch ended: {session.stream_error}")
        for devices in session.lists:
            expect(
                len(set(ids(devices))) == len(devices),
                f"{resource}: a list repeats a device: {listing(ids(devices))}",
            )
            odd = {d.health for d in devices} - {HEALTHY, UNHEALTHY}
            expect(
                not odd,
                f"{resource}: health strings {listing(sorted(odd))}; the kubelet knows only "
                "Healthy/Unhealthy",
            )
        driver = await w.host.sources[resource].list_devices()
        want = sorted((d.id, str(d.health), tuple(d.numa_nodes)) for d in driver)
        got = sorted((d.id, d.health, d.numa_nodes) for d in session.latest)
        expect(
            got == want,
            f"{resource}: the kubelet's list ({plain_devices(got)}) is not the driver's "
            f"({plain_devices(want)})",
        )


async def health_change(w: DriverWorld) -> None:
    """A device the driver reports Unhealthy (the last Healthy one of its first resource, through
    --health-hook) reaches the kubelet as a full list with that device Unhealthy and every other
    device still there."""
    if w.driver.health_hook is None:
        raise Skip("no --health-hook given: devshim cannot make a driver report a health change")
    resource = next((r for r in w.resources if _healthy(w.session(r).latest)), None)
    if resource is None:
        raise Skip("the driver lists no Healthy device")
    session = w.session(resource)
    before = session.latest
    device = _healthy(before)[-1]
    await w.run_health_hook(resource, device)
    try:
        after = await session.wait_for_list(
            lambda ds: any(d.id == device and d.health == UNHEALTHY for d in ds), timeout=10
        )
    except TimeoutError:
        raise Failed(f"{resource}: {device} never reached the kubelet as Unhealthy") from None
    expect(
        sorted(ids(after)) == sorted(ids(before)),
        f"{resource}: the list changed from {listing(ids(before))} to {listing(ids(after))}",
    )


async def health_watch(w: DriverWorld) -> str:
    """A health change the driver makes on its own (no hook) reaches the kubelet: for up to
    --health-watch seconds (since its first list) the kubelet's lists are watched; then every
    resource's health as the kubelet has it must be what the driver itself lists. No change
    within the time is no failure."""
    wait_s = w.driver.health_watch_s
    if wait_s <= 0:
        raise Skip("give --health-watch SECONDS to wait for health changes the driver makes on its own")
    before = {r: _health(w.session(r).lists[0]) for r in w.resources}  # a change during start counts
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    changed: list[str] = []
    while not changed and loop.time() < deadline:
        await asyncio.sleep(0.05)
        changed = [r for r in w.resources if _health(w.session(r).latest) != before[r]]
    for resource in w.resources:
        # Asked directly: devshim's copy is only what the driver notified.
        driver = sorted((d.id, str(d.health)) for d in await w.host.sources[resource].ask())
        kubelet = _health(w.session(resource).latest)
        expect(
            driver == kubelet,
            f"{resource}: the driver lists {plain_health(driver)}; the kubelet still has "
            f"{plain_health(kubelet)} (was the change notified with health_changed or devices_changed?)",
        )
    if not changed:
        raise Skip(f"the driver changed no device's health within {wait_s:g} s")
    waited = wait_s - (deadline - loop.time())
    return "; ".join(
        f"{r}: {plain_health(sorted(set(_health(w.session(r).latest)) - set(before[r])))} "
        f"after {waited:.1f} s"
        for r in changed
    )


async def allocate(w: DriverWorld) -> str:
    """Allocate of one Healthy device answers one container response, for every resource, with
    the grant `devshim run` would pass (its grant policy applies) and everything --expect names,
    each CDI name it gives resolving in a CDI spec (cdi_resolve.py); the pass shows each
    resource's grant."""
    seen = []
    for resource in w.resources:
        session = w.session(resource)
        healthy = _healthy(session.latest)
        if healthy:
            grant = await session.allocate(healthy[:1])
            shown = describe_grant(grant)
            folders = [w.root / CDI_FOLDER, *w.driver.cdi_dirs]
            for name in unresolved(grant.cdi_devices, folders):
                raise Failed(f"{resource}: {advice(name, folders)}")
            for expected in w.driver.expect:
                wanted_resource, item = expectation(expected)
                if wanted_resource in ("", resource) and item not in grant_items(grant):
                    raise Failed(f"{resource}: the grant lacks {item} (--expect); it has {shown}")
            seen.append(f"{resource} {healthy[0]}: {shown}")
    if not seen:
        raise Skip("the driver lists no Healthy device to allocate")
    return "; ".join(seen)


EXPECT_KINDS = ("env", "node", "mount", "annotation", "cdi")


def expectation(text: str) -> tuple[str, str]:
    """--expect's "[RESOURCE:]KIND=VALUE" as (resource or "", "KIND=VALUE"); ValueError if malformed."""
    head, colon, tail = text.partition(":")
    resource, item = (head, tail) if colon and "=" not in head else ("", text)
    kind, equals, value = item.partition("=")
    if kind not in EXPECT_KINDS or not equals or not value:
        raise ValueError(
            f"--expect {text!r}: not [RESOURCE:]KIND=VALUE with KIND one of {', '.join(EXPECT_KINDS)}"
        )
    return resource, item


def grant_items(grant: Grant) -> set[str]:
    """What --expect can name: env=NAME, node=HOST_PATH, mount=HOST_PATH, annotation=KEY, cdi=NAME."""
    return {
        *(f"env={name}" for name in grant.envs),
        *(f"node={host}" for _, host, _ in grant.device_nodes),
        *(f"mount={host}" for _, host, _ in grant.mounts),
        *(f"annotation={key}" for key in grant.annotations),
        *(f"cdi={name}" for name in grant.cdi_devices),
    }


def describe_grant(grant: Grant) -> str:
    parts = [f"env {k}={v}" for k, v in grant.envs.items()]
    parts += [f"node {host} -> {container} ({perms})" for container, host, perms in grant.device_nodes]
    parts += [f"mount {host} -> {container}{' (ro)' if ro else ''}" for container, host, ro in grant.mounts]
    parts += [f"annotation {k}={v}" for k, v in grant.annotations.items()]
    parts += [f"cdi {name}" for name in grant.cdi_devices]
    return ", ".join(parts) or "nothing"


async def preferred_allocation(w: DriverWorld) -> None:
    """GetPreferredAllocation answers a subset of the available devices that holds the
    must-include ones and is no larger than asked."""
    for resource in _with(w, "preferred_allocation", "preferred allocation"):
        session = w.session(resource)
        available = _healthy(session.latest)
        if len(available) < 2:
            raise Skip(f"{resource}: fewer than 2 Healthy devices to choose between")
        must = available[-1:]
        answer = await session.preferred_allocation(available, must, 2)
        expect(set(answer) <= set(available), f"{resource}: preferred {answer}, not among {available}")
        expect(set(must) <= set(answer), f"{resource}: preferred {answer} lacks the must-include {must}")
        expect(
            len(answer) <= 2 and len(set(answer)) == len(answer), f"{resource}: preferred {answer} for size 2"
        )


async def prestart(w: DriverWorld) -> None:
    """PreStartContainer after Allocate reaches the driver and succeeds."""
    for resource in _with(w, "pre_start", "pre-start"):
        session = w.session(resource)
        expect(session.options.pre_start_required, f"{resource}: options do not ask for PreStartContainer")
        before = w.calls_ok("prestart")
        await session.admit(1)
        await w.wait_for_calls("prestart", before + 1)


async def deallocate(w: DriverWorld) -> None:
    """A pod's devices, freed when it ends, reach the driver's deallocate exactly once: from the
    kubelet's Deallocate on v1beta2, from devshim's PodResources emulation on v1beta1."""
    resources = _with(w, "deallocate", "deallocate")
    before = w.calls_ok("deallocate")
    for n, resource in enumerate(resources):
        await w.kubelet.run_pod("default", f"p{n}", [ContainerSpec("app", resource, 1)])
        await w.kubelet.end_pod("default", f"p{n}")
    await w.expect_deallocations(before, len(resources))


async def post_stop(w: DriverWorld) -> None:
    """On v1beta2, PostStopContainer of an ended container reaches the driver."""
    resources = _with(w, "post_stop", "post-stop")
    if w.kubelet_now.negotiated != "v1beta2":
        raise Skip("v1beta1 has no PostStopContainer")
    before = w.calls_ok("post_stop")
    for n, resource in enumerate(resources):
        await w.kubelet.run_pod("default", f"p{n}", [ContainerSpec("app", resource, 1)])
        await w.kubelet.end_pod("default", f"p{n}")
    await w.wait_for_calls("post_stop", before + len(resources))


async def _restart_into(w: DriverWorld, kubelet: Kubelet) -> None:
    """Restart the kubelet as `kubelet`; then every resource must be registered again with the
    version the new kubelet speaks, every list it received holding every device it had, and the
    driver must not have been restarted."""
    pid = w.driver_pid()
    devices = {r: sorted(ids(w.session(r).latest)) for r in w.resources}
    await restart_kubelet(w, kubelet)
    for resource, known in devices.items():
        session = await w.registered(resource, count=2)
        for listed in session.lists:
            expect(
                sorted(ids(listed)) == known,
                f"{resource}: after the restart a list held {listing(ids(listed))}, not {listing(known)}",
            )
    expect(w.driver_pid() == pid, "the driver was restarted")


async def kubelet_restart(w: DriverWorld) -> None:
    """The kubelet restarts (with its profile's cleanup of device-plugins/): devshim registers
    every resource again and loses no device."""
    await _restart_into(w, w.kubelet_now)


async def upgrade(w: DriverWorld) -> None:
    """The kubelet is replaced by the next one up the line (newer profile or API versions)."""
    newer = w.mode.newer
    if newer is None:
        raise Skip("the newest kubelet modelled: nothing to upgrade to")
    await _restart_into(w, newer)


async def downgrade(w: DriverWorld) -> None:
    """The kubelet one step up the line is replaced by this mode's (the world starts one step up)."""
    await _restart_into(w, w.mode.kubelet)


async def socket_removed(w: DriverWorld) -> None:
    """Someone removes devshim's socket while the kubelet runs on: devshim serves afresh and
    registers again with the same kubelet, which ends up with a live stream listing every device.
    Kubelets 1.25 until PR #135437 tear down a re-registration when the replaced stream ends
    (kubernetes #121994), so devshim must close the old stream first or recover from it."""
    for resource in w.resources:
        known = sorted(ids(w.session(resource).latest))
        socket = w.shim.served[resource].endpoint.socket_path
        socket.unlink()
        await w.registered(resource, count=2)
        # A torn-down registration shows as a stream the kubelet closed: wait for one that lasts.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RECOVERY_TIMEOUT_S
        while True:
            await asyncio.sleep(STREAM_OPEN_S)
            session = w.current_session(resource)
            if session is not None and session.lists and not session.stream_ended.is_set():
                break
            why = session.stream_error if session is not None else "the kubelet has no plugin for it"
            expect(
                loop.time() < deadline,
                f"{resource}: no live registration after the socket was removed: {why}",
            )
        expect(
            sorted(ids(session.latest)) == known,
            f"{resource}: listed {listing(ids(session.latest))}, not {listing(known)}",
        )


async def devshim_restart(w: DriverWorld) -> None:
    """devshim stops as on SIGTERM (every upgrade does) and starts again, its state folder kept:
    every resource registers again with the options its driver declares (the kubelet reads them
    once per registration and acts on nothing else), and a pod started then gets PreStartContainer
    where the driver asks for it. devshim once registered a restored resource with default
    options and never again, so after each upgrade no pod got PreStartContainer."""
    registered = {r: _registrations(w, r) for r in w.resources}
    await w.restart_devshim()
    await w.driver_up()
    for resource in w.resources:
        await w.registered(resource, count=registered.get(resource, 0) + 1)
    for resource in w.resources:
        await _options_become(w, resource)
    for resource in [r for r in w.resources if w.capabilities(r).pre_start]:
        session = w.session(resource)
        try:  # restored from the inventory, its devices are Unhealthy until the driver lists them
            await session.wait_for_list(lambda ds: bool(_healthy(ds)), timeout=START_TIMEOUT_S)
        except TimeoutError:
            why = f"no Healthy device within {START_TIMEOUT_S:g} s of devshim's restart"
            raise Failed(f"{resource}: {why}") from None
        before = w.calls_ok("prestart")
        await session.admit(1)
        await w.wait_for_calls("prestart", before + 1)


async def _options_become(w: DriverWorld, resource: str) -> None:
    """Until the kubelet's session of ``resource`` holds the options its driver declares."""
    caps = w.capabilities(resource)
    wanted = (caps.pre_start, caps.preferred_allocation)
    try:
        await w.kubelet.wait_until(lambda: _options(w, resource) == wanted, timeout=START_TIMEOUT_S)
    except TimeoutError:
        raise Failed(
            f"{resource}: after devshim restarted the kubelet holds options (pre-start, preferred) "
            f"{_shown(_options(w, resource))}, while the driver declares {_shown(wanted)}"
        ) from None


def _registrations(w: DriverWorld, resource: str) -> int:
    return sum(r.ok for r in w.kubelet.registrations if r.resource_name == resource)


def _shown(options: tuple[bool, bool] | None) -> str:
    """(pre-start, preferred) as text: "pre-start yes, preferred no"."""
    if options is None:
        return "none (no registration)"
    return flags({"pre-start": options[0], "preferred": options[1]})


def _options(w: DriverWorld, resource: str) -> tuple[bool, bool] | None:
    session = w.current_session(resource)
    if session is None:
        return None
    return session.options.pre_start_required, session.options.get_preferred_allocation_available


async def driver_crash(w: DriverWorld) -> None:
    """The driver is SIGKILLed: the kubelet gets its devices as Unhealthy (none vanishes), and once
    devshim has restarted the driver, the same devices with their health as before."""
    before = {r: (w.session(r).latest, len(w.session(r).lists)) for r in w.resources}
    w.kill_driver()
    for resource, (devices, seen) in before.items():
        # Lists since the kill: every resource's outage list may be history by the time we look.
        lists = await _lists_since(w, resource, seen, lambda ds: all(d.health == UNHEALTHY for d in ds))
        if lists is None:
            raise Failed(f"{resource}: the kubelet never saw the devices Unhealthy after the crash")
        down = next(ds for ds in lists if all(d.health == UNHEALTHY for d in ds))
        expect(
            sorted(ids(down)) == sorted(ids(devices)),
            f"{resource}: during the outage the list was {listing(ids(down))}, not {listing(ids(devices))}",
        )
        health = _health(devices)

        def recovered(ds: tuple[DeviceState, ...], want: list[tuple[str, str]] = health) -> bool:
            return _health(ds) == want

        back = await _lists_since(w, resource, seen + lists.index(down), recovered)
        if back is None:
            raise Failed(
                f"{resource}: not back to {plain_health(health)} within {RECOVERY_TIMEOUT_S:g} s of the "
                "crash; "
                f"the driver is {w.host.status}"
            )


async def _lists_since(
    w: DriverWorld, resource: str, start: int, wanted: Callable[[tuple[DeviceState, ...]], bool]
) -> list[tuple[DeviceState, ...]] | None:
    """The lists the kubelet got for `resource` from index `start` on, once one is `wanted`;
    None if none is within RECOVERY_TIMEOUT_S."""
    session = w.session(resource)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RECOVERY_TIMEOUT_S
    while not any(wanted(ds) for ds in session.lists[start:]):
        if loop.time() > deadline:
            return None
        await asyncio.sleep(0.02)
    lists: list[tuple[DeviceState, ...]] = session.lists[start:]
    return lists


def _health(devices: tuple[DeviceState, ...]) -> list[tuple[str, str]]:
    return sorted((d.id, d.health) for d in devices)


SCENARIOS: dict[str, Scenario] = {
    f.__name__: f
    for f in (register, list_watch, health_change, health_watch, allocate, preferred_allocation, prestart,
              deallocate, post_stop, kubelet_restart, upgrade, downgrade, socket_removed, driver_crash,
              devshim_restart)
}  # fmt: skip


def starts_one_step_up(scenario: str) -> bool:
    """A downgrade cell's world starts with the next kubelet up the line."""
    return scenario == "downgrade"

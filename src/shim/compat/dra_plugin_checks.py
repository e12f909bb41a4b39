"""The rows of `devshim compat --dra --dra-plugin CMD`: what a release's real DRA manager, with a
real API server, must see of a DRA kubelet plugin that is not behind devshim (docs/compat.md,
"A DRA kubelet plugin").

Each row runs in a fresh world (dra_plugin_world.plugin_node): the plugin started from CMD and
the kubelet release's DRA manager, on a new node of the column's API server. As for devshim's own
pool (dra_scenarios.py) the row plays the scheduler from the slices the plugin published, so
nothing of the plugin needs to be known beforehand but its command.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from shim.compat.dra_matrix import Column, Pair, run_pairs
from shim.compat.dra_plugin_world import PluginCell, PluginNode, registered
from shim.compat.dra_scenarios import chosen_service, claims_version, known_services
from shim.compat.dra_world import allocate_claim, claim_pod, unprepare_retrying
from shim.compat.plain import listing
from shim.compat.results import Failed, Result, expect
from shim.compat.upstream.dra_manager import DraManagerError, Pod

PROBE_TIMEOUT_S = 5.0
NOT_SERVED = (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE)


def _method(service: str) -> tuple[str, bool] | None:
    """The gRPC method that shows `service` is served, and whether it streams; None: unknown."""
    version, _, name = service.partition(".")
    if name == "DRAPlugin":
        return f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources", False
    if name == "DRAResourceHealth":
        return f"/{version}.DRAResourceHealth/NodeWatchResources", True
    return None


async def served(endpoint: str, service: str) -> str | None:
    """None when `endpoint` serves `service`; else what it answered. Raw bytes, no stubs: b"" is
    a request with no claims (or a health watch), which every served version accepts."""
    method = _method(service)
    assert method is not None
    path, streams = method
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
        try:
            if streams:
                # A health stream may stay quiet: only an error before PROBE_TIMEOUT_S counts.
                stream = channel.unary_stream(path, None, None)(b"", timeout=PROBE_TIMEOUT_S)
                await stream.read()
            else:
                await channel.unary_unary(path, None, None)(b"", timeout=PROBE_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            # Any other answer (INVALID_ARGUMENT, say) comes from a handler; a health stream
            # that stays open past the deadline is served, a prepare that does not answer is not.
            code = err.code()
            if code in NOT_SERVED or (code == grpc.StatusCode.DEADLINE_EXCEEDED and not streams):
                return f"{code.name}: {err.details()}"
    return None


async def _claim(cell: PluginCell, node: PluginNode, name: str, pods: Sequence[Pod]) -> dict[str, Any]:
    """A claim of the first published device, reserved for `pods`, as the scheduler leaves it."""
    pool = await cell.published(node.driver).until(
        lambda pool: len(pool) > 0, "the plugin published a device"
    )
    return allocate_claim(
        cell.plane, claims_version(cell.kubelet.minor), name, [("r0", sorted(pool)[0])],
        node=cell.node, driver=node.driver, pods=[(p.name, p.uid) for p in pods],
    )  # fmt: skip


async def _prepare(node: PluginNode, pod: Pod) -> tuple[str, ...]:
    """The pod prepared by the DRA manager and its container's CDI devices resolved by the CDI
    library; the CDI device IDs."""
    try:
        await node.manager.prepare(pod)
    except DraManagerError as err:
        service = chosen_service(node.cell.kubelet.minor, node.registration.versions)
        raise Failed(f"the DRA manager could not prepare the claim through {service}: {err}") from None
    got = await node.manager.resources(pod.uid, "c0")
    expect(bool(got.cdi_devices), "the plugin prepared the claim with no CDI device")
    expect(got.cdi_error == "", f"the CDI library could not resolve the plugin's answer: {got.cdi_error}")
    return got.cdi_devices


async def _prepared(cell: PluginCell, node: PluginNode, name: str) -> tuple[Pod, tuple[str, ...]]:
    pod = claim_pod(name)
    await _claim(cell, node, name, [pod])
    return pod, await _prepare(node, pod)


async def register(cell: PluginCell) -> str:
    async with cell.world() as node:
        calls = [r for r in await node.manager.registrations() if r.op == "register"]
        expect(len(calls) == 1, f"the plugin manager registered the plugin {len(calls)} times")
        got = node.registration
        known, chosen = known_services(cell.kubelet.minor), chosen_service(cell.kubelet.minor, got.versions)
        # Only 1.33 registers a plugin offering none it knows: it falls back to v1alpha4.Node.
        expect(
            any(v in known for v in got.versions),
            f"{got.driver} offers {listing(got.versions)}; the {cell.kubelet.name} kubelet knows only "
            f"{', '.join(known)}, and calls {chosen}",
        )
        expect(Path(got.endpoint).is_socket(), f"its endpoint {got.endpoint} is not a socket")
        return f"{got.driver} as a DRAPlugin, offering {', '.join(got.versions)}; {chosen} chosen"


async def services(cell: PluginCell) -> str:
    """Every service the registration advertises answers at the endpoint."""
    async with cell.world() as node:
        probed, missing = [], []
        for service in node.registration.versions:
            if _method(service) is None:
                continue
            probed.append(service)
            if (why := await served(node.registration.endpoint, service)) is not None:
                missing.append(f"{service} ({why})")
        expect(not missing, f"advertised but not served: {'; '.join(missing)}")
        expect(bool(probed), f"no DRA service among {listing(node.registration.versions)}")
        return f"serves {', '.join(probed)}"


async def publish(cell: PluginCell) -> str:
    async with cell.world() as node:
        published = cell.published(node.driver)
        pool = await published.until(
            lambda pool: len(pool) > 0, f"{node.driver} published a complete pool for {cell.node}"
        )
        return f"{len(pool)} devices in resource.k8s.io/{published.version}"


async def prepare(cell: PluginCell) -> str:
    async with cell.world() as node:
        pod, ids = await _prepared(cell, node, "prepared")
        await node.manager.unprepare(pod.uid)
        return f"prepared as {', '.join(ids)}, unprepared"


async def shared(cell: PluginCell) -> str:
    """A claim reserved for two pods: both get the same CDI devices, the second still resolving
    after the first is gone."""
    async with cell.world() as node:
        first = claim_pod("shared")
        second = dataclasses.replace(claim_pod("shared"), name="pod-shared-2")
        await _claim(cell, node, "shared", [first, second])
        ids = {await _prepare(node, first), await _prepare(node, second)}
        expect(len(ids) == 1, f"the two pods of one claim got different CDI devices: {sorted(ids)}")
        await node.manager.unprepare(first.uid)
        got = await node.manager.resources(second.uid, "c0")
        expect(got.cdi_error == "", f"the second pod's devices no longer resolve: {got.cdi_error}")
        await node.manager.unprepare(second.uid)
        return "the same CDI devices for two pods, unprepared after the last"


async def kubelet_restart(cell: PluginCell) -> str:
    async with cell.world() as node:
        pod, _ = await _prepared(cell, node, "survivor")
        await node.manager.restart()
        await registered(cell, node.manager, node.process)
        await _prepare(node, pod)  # the pod's next sync after a kubelet restart
        await node.manager.unprepare(pod.uid)
        return "registered and prepared again after the restart"


async def plugin_restart(cell: PluginCell) -> str:
    """The plugin SIGKILLed between prepare and unprepare, then started again."""
    async with cell.world() as node:
        pod, _ = await _prepared(cell, node, "kept")
        before = len(await node.manager.registrations())
        await node.kill_plugin()
        await node.start_plugin()
        await registered(cell, node.manager, node.process, after=before)
        got = await node.manager.resources(pod.uid, "c0")
        expect(got.cdi_error == "", f"after the restart the CDI library fails: {got.cdi_error}")
        await unprepare_retrying(node.manager, pod.uid)
        return "unprepared by the restarted plugin"


CHECKS: dict[str, Callable[[PluginCell], Awaitable[str]]] = {
    "register": register,
    "services": services,
    "publish": publish,
    "prepare": prepare,
    "shared": shared,
    "kubelet_restart": kubelet_restart,
    "plugin_restart": plugin_restart,
}


async def run_dra_plugin_matrix(
    command: str,
    pairs: Sequence[Pair],
    checks: Sequence[str],
    timeout_s: float,
    progress: Callable[[Result], None],
) -> list[Result]:
    """The plugin started from ``command`` in every (check, pair) cell."""

    def run_row(row: str, column: Column, folder: Path, node: str) -> Awaitable[str]:
        return CHECKS[row](
            PluginCell(command, column.plane, column.kubelet, column.manager_binary, folder, node)
        )

    return await run_pairs(pairs, checks, timeout_s, progress, run_row)

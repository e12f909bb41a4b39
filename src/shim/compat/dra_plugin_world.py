"""One cell's world for `devshim compat --dra --dra-plugin CMD`: a DRA kubelet plugin that is not
behind devshim, started from CMD, with a release's real DRA manager as the kubelet
(shim.compat.upstream.dra_manager) and a real API server (shim.compat.realnode).

CMD is started once per cell, its placeholders filled in with the cell's paths (and the same set
as environment variables, for a plugin that reads its settings from there):

    {registry}    DEVSHIM_COMPAT_REGISTRY  the plugins_registry the plugin watcher watches
    {plugins}     DEVSHIM_COMPAT_PLUGINS   a folder of its own for its DRA socket
    {cdi}         DEVSHIM_COMPAT_CDI       the CDI spec folder the DRA manager resolves
    {node}        DEVSHIM_COMPAT_NODE      the node's name (its pool)
    {kubeconfig}  KUBECONFIG               an admin kubeconfig of the cell's API server

The plugin publishes its ResourceSlices itself; its driver's name is what it registers with.
The scheduler is played as for devshim's own pool (dra_world.Published, allocate_claim).
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shim.compat.dra_world import Published
from shim.compat.plugin_process import kill_plugin, start_plugin, stop_plugin
from shim.compat.realnode import ControlPlane
from shim.compat.results import Failed
from shim.compat.tails import log_tail
from shim.compat.upstream.dra_manager import DraManager, Registration, running_dra_manager
from shim.compat.upstream.releases import Release

DRA_REGISTER_TIMEOUT_S = 30.0
LOG_TAIL = 4000


@dataclass(frozen=True)
class PluginCell:
    """One cell's setting: the plugin's command, the column's API server and kubelet release, a
    folder of its own and the node's name."""

    command: str
    plane: ControlPlane
    kubelet: Release
    manager_binary: Path
    folder: Path
    node: str
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))

    def places(self) -> dict[str, str]:
        return {
            "registry": str(self.folder / "registry"),
            "plugins": str(self.folder / "plugins"),
            "cdi": str(self.folder / "cdi"),
            "node": self.node,
            "kubeconfig": str(self.plane.admin_kubeconfig),
        }

    def argv(self) -> list[str]:
        argv = shlex.split(self.command)
        for name, value in self.places().items():
            argv = [arg.replace(f"{{{name}}}", value) for arg in argv]
        return argv

    def environment(self) -> dict[str, str]:
        places = self.places()
        named = {f"DEVSHIM_COMPAT_{k.upper()}": v for k, v in places.items() if k != "kubeconfig"}
        return {**self.env, **named, "KUBECONFIG": places["kubeconfig"]}

    def published(self, driver: str) -> Published:
        return Published.newest(self.plane, self.node, driver)

    def world(self) -> AbstractAsyncContextManager[PluginNode]:
        return plugin_node(self)

    def log(self, start: int) -> Path:
        """The plugin's output of its `start`th start (1: the first)."""
        return self.folder / ("plugin.log" if start == 1 else f"plugin-{start}.log")


@dataclass
class PluginNode:
    """The plugin and the DRA manager on the cell's node; `registration` is the plugin manager's
    accepted RegisterPlugin (its driver, endpoint and supported versions)."""

    cell: PluginCell
    manager: DraManager
    process: asyncio.subprocess.Process
    registration: Registration
    starts: int = 1

    @property
    def driver(self) -> str:
        return self.registration.driver

    def log_tail(self) -> str:
        return log_tail(self.cell.log(self.starts), LOG_TAIL)

    async def kill_plugin(self) -> None:
        """SIGKILL to the plugin and what it started, as an OOM kill ends it: nothing cleaned up."""
        await kill_plugin(self.process)

    async def start_plugin(self) -> None:
        """The plugin started again with the same command (its output to a log of its own)."""
        self.starts += 1
        self.process = await start_plugin(
            self.cell.argv(), self.cell.environment(), self.cell.log(self.starts)
        )


async def registered(
    cell: PluginCell, manager: DraManager, process: asyncio.subprocess.Process, *, after: int = 0
) -> Registration:
    """The plugin manager's first accepted registration among its calls on the DRA handler after
    the first `after`; Failed with the handler's error when it refused one, or when the plugin
    exits or never registers."""
    calls: list[Registration] = []
    try:
        async with asyncio.timeout(DRA_REGISTER_TIMEOUT_S):
            while True:
                calls = (await manager.registrations())[after:]
                for call in calls:
                    if call.error:
                        versions = list(call.versions)
                        raise Failed(
                            f"the {cell.kubelet.name} DRA plugin handler refused {call.driver!r} "
                            f"({call.op}, versions {versions}): {call.error}"
                        )
                    if call.op == "register":
                        return call
                if process.returncode is not None:
                    raise Failed(f"the plugin exited ({process.returncode}) before it registered")
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise Failed(
            f"the plugin did not register with the {cell.kubelet.name} plugin watcher within "
            f"{DRA_REGISTER_TIMEOUT_S:g} s (a registration socket in {{registry}}?); its calls: {calls}"
        ) from None


@asynccontextmanager
async def plugin_node(cell: PluginCell) -> AsyncIterator[PluginNode]:
    """The DRA manager started on the cell's folders for its node, then the plugin, the block
    entered once the plugin registered; Failed with the logs' ends when either does not come up,
    and with the plugin's when the block fails. The plugin is stopped (its process group) after."""
    for sub in ("manager-state", "registry", "plugins", "cdi"):
        (cell.folder / sub).mkdir(exist_ok=True)
    cell.plane.ensure("/api/v1/nodes", {"metadata": {"name": cell.node}})
    manager_log = cell.folder / "dramanager.log"
    async with running_dra_manager(cell.kubelet, cell.manager_binary, manager_log) as manager:
        await manager.start(
            cell.plane.admin_kubeconfig, cell.node, cell.folder / "manager-state",
            cell.folder / "registry", [cell.folder / "cdi"],
        )  # fmt: skip
        process = await start_plugin(cell.argv(), cell.environment(), cell.log(1))
        node = PluginNode(cell, manager, process, Registration("", "", "", (), ""))
        try:
            try:
                node.registration = await registered(cell, manager, process)
            except Failed as failed:
                tail = log_tail(manager_log, LOG_TAIL)
                raise Failed(
                    f"{failed}\n--- the plugin's log, the end:\n{node.log_tail()}\n"
                    f"--- the DRA manager's:\n{tail}"
                ) from None
            try:
                yield node
            except Failed as failed:  # a row's check: what the plugin logged is what its author reads next
                raise Failed(f"{failed}\n--- the plugin's log, the end:\n{node.log_tail()}") from None
        finally:
            await stop_plugin(node.process)

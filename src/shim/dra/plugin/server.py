"""One DRA driver's sockets: where the kubelet's plugin watcher finds it, and where it calls it.

The registration socket ``<plugins_registry>/<driver>-reg.sock`` serves the plugin watcher's
Registration (type DRAPlugin, the endpoint below, every service offered, newest first: the
kubelet takes the first DRAPlugin version it knows, and from 1.37 the first DRAResourceHealth
version it knows, from this list). The DRA socket ``<dra.plugins_dir>/<driver>/dra.sock``
serves every offered version over the one DraService. Both are published whole, with their
permissions (node/sockets.py), and served again if someone removes them.

Unlike a device plugin's, a DRA registration survives a kubelet restart untouched: the new
kubelet finds the socket in plugins_registry and calls GetInfo again.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
from loguru import logger

from shim.dra.plugin import health_v1, health_v1alpha1, v1, v1beta1
from shim.dra.plugin.common import DraService
from shim.node import sockets
from shim.node.pluginregistration import DRA_PLUGIN_TYPE, add_registration_service
from shim.ops import metrics
from shim.settings import SocketSettings

# Newest first, as the kubelet reads them (pkg/kubelet/cm/dra/plugin, validateSupportedServices
# and pickHealthService). Kubelets up to 1.36 dial v1alpha1 health whether or not it is listed.
VERSIONS = (v1.VERSION, v1beta1.VERSION, health_v1.VERSION, health_v1alpha1.VERSION)
SERVICES = tuple(version.name for version in VERSIONS)
CHECK_S = 1.0  # how often the sockets are checked to be there (two stat calls)


def socket_paths(driver: str, registry_dir: Path, plugins_dir: Path) -> tuple[Path, Path]:
    """(the registration socket, the DRA socket) of ``driver``."""
    return registry_dir / f"{driver}-reg.sock", plugins_dir / driver / "dra.sock"


class DraPluginServer:
    def __init__(
        self, service: DraService, registry_dir: Path, plugins_dir: Path, socket_settings: SocketSettings
    ) -> None:
        self.service = service
        self.driver = service.status.driver
        self.registration_path, self.socket_path = socket_paths(self.driver, registry_dir, plugins_dir)
        self._socket_settings = socket_settings
        self._server: grpc.aio.Server | None = None
        self._created: dict[Path, sockets.FileIdentity] = {}

    async def run(self) -> None:
        """Serve until cancelled; the sockets served again whenever one is gone."""
        try:
            while True:
                if not self._intact():
                    try:
                        await self._serve_fresh()
                    except (OSError, sockets.SocketInUse, sockets.SocketSetupFailed, RuntimeError) as exc:
                        # grpc raises RuntimeError for a port it cannot bind: said, and tried again
                        self.service.status.last_error = f"cannot serve: {exc}"
                        logger.error("DRA driver {}: cannot serve: {}; trying again", self.driver, exc)
                        await self.close()
                await asyncio.sleep(CHECK_S)
        finally:
            await self.close()

    def _intact(self) -> bool:
        return bool(self._created) and all(sockets.identity(p) == made for p, made in self._created.items())

    async def _serve_fresh(self) -> None:
        if self._created:
            logger.warning("DRA driver {}: a socket was removed; serving again", self.driver)
        await self.close()
        for folder in (self.socket_path.parent, self.registration_path.parent):
            folder.mkdir(mode=0o750, parents=True, exist_ok=True)
        for path in (self.registration_path, self.socket_path):
            sockets.clear_stale_socket(path)
        server = grpc.aio.server()
        for version in VERSIONS:
            version.add(server, self.service)
        add_registration_service(
            server, self.driver, SERVICES, self._on_status,
            plugin_type=DRA_PLUGIN_TYPE, endpoint=str(self.socket_path),
        )  # fmt: skip
        # The DRA socket first: the plugin watcher may call GetInfo, and then dial the
        # endpoint, the moment the registration socket appears.
        with (
            sockets.PrivateBind(self.socket_path, self._socket_settings) as dra,
            sockets.PrivateBind(self.registration_path, self._socket_settings) as registration,
        ):
            server.add_insecure_port(f"unix:{dra.path}")
            server.add_insecure_port(f"unix:{registration.path}")
            await server.start()
            self._server = server
            self._created[self.socket_path] = dra.publish()
            self._created[self.registration_path] = registration.publish()
        self.service.status.registered = None
        logger.info(
            "DRA driver {}: serving {} at {}, registered through {}",
            self.driver, ", ".join(SERVICES), self.socket_path, self.registration_path,
        )  # fmt: skip

    def _on_status(self, registered: bool, error: str) -> None:
        self.service.status.registered = registered
        self.service.status.registration_error = error or None
        metrics.registration(self.driver, DRA_PLUGIN_TYPE, registered)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await asyncio.shield(server.stop(grace=1.0))
        for path, made in self._created.items():
            with contextlib.suppress(OSError):
                sockets.remove_own_socket(path, made)
        self._created.clear()

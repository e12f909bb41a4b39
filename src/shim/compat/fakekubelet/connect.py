"""How a plugin becomes a session: Register's checks on the classic path, then the connection.

pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go Register checks the request;
handler.go connectClient, client.go dial and manager.go PluginConnected connect the plugin, on the
classic and on the plugin watcher path alike. The messages are upstream's (api.go).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc

from .api import PluginClient
from .errors import RegistrationRejected
from .gotext import go_quote, go_quote_strings, go_rpc_error
from .names import is_extended_resource_name
from .records import PluginOptions, RegisterRequest
from .session import PluginSession


def check_register(request: RegisterRequest, service_version: str, plugin_dir: Path) -> Path:
    """server.go Register's checks, in its order, for a Register that arrived on the Registration
    service of `service_version`; the plugin's socket path, or RegistrationRejected."""
    # isVersionCompatibleWithPlugin compares with the serving API package's SupportedVersions
    # (deviceplugin/v1beta1 constants.go: [...]string{"v1beta1"}), so a version's service accepts
    # its own version only; the message is api.go errUnsupportedVersion formatted with that array.
    if request.version != service_version:
        raise RegistrationRejected(
            f"requested API version {go_quote(request.version)} is not supported by kubelet. "
            f"Supported version is {go_quote_strings([service_version])}"
        )
    if not is_extended_resource_name(request.resource_name):
        raise RegistrationRejected(f"the ResourceName {go_quote(request.resource_name)} is invalid")
    # filepath.Join(socketDir, endpoint) joins and cleans even an absolute endpoint (pathlib's `/`
    # would replace the directory instead).
    return Path(os.path.normpath(f"{plugin_dir}/{request.endpoint}"))


async def connect_session(
    resource: str,
    endpoint: str,
    client: PluginClient,
    version: str,
    dial_timeout_s: float,
    rpc_timeout_s: float,
    allocated: set[str],
    options: PluginOptions | None = None,
) -> PluginSession:
    """Dial the plugin and ask for its options; RegistrationRejected with the kubelet's message.

    `options`: the ones a <= 1.24 kubelet took from RegisterRequest instead of asking."""
    try:
        # client.go dial: a blocking dial bounded by a 10 s timeout (errFailedToDialDevicePlugin).
        async with asyncio.timeout(dial_timeout_s):
            await client.connect()
    except TimeoutError:
        raise RegistrationRejected("failed to dial device plugin: context deadline exceeded") from None
    if options is None:
        try:
            options = await client.get_options(rpc_timeout_s)
        except grpc.aio.AioRpcError as err:  # manager.go PluginConnected
            raise RegistrationRejected(f"failed to get device plugin options: {go_rpc_error(err)}") from None
    return PluginSession(
        resource, endpoint, options, client, version=version, rpc_timeout_s=rpc_timeout_s, allocated=allocated
    )

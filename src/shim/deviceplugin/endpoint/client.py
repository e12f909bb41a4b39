"""Registering with the kubelet (classic): Register on kubelet.sock, newest offered version first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
from loguru import logger

from shim.core.api import PluginResource
from shim.deviceplugin.api import ApiVersion
from shim.facts import REGISTER_TIMEOUT_S


class RegisterFailed(Exception):
    """The kubelet refused or failed our Register (retried with backoff by the cycle)."""

    def __init__(self, version: str, error: str) -> None:
        super().__init__(error)
        self.version = version
        self.error = error


def version_refused(exc: grpc.aio.AioRpcError) -> bool:
    """A kubelet without this version: no such Registration service (UNIMPLEMENTED), or its
    answer to an unknown version (devicemanager server.go: errUnsupportedVersion)."""
    return exc.code() is grpc.StatusCode.UNIMPLEMENTED or "is not supported" in (exc.details() or "")


async def register(
    apis: Sequence[ApiVersion], kubelet_socket: Path, socket_name: str, resource: PluginResource
) -> str:
    """Register through the newest of ``apis`` the kubelet speaks; the version it took.
    RegisterFailed for any failure but a version the kubelet lacks."""
    for api in apis:
        try:
            await api.register(kubelet_socket, socket_name, resource, REGISTER_TIMEOUT_S)
            return api.name
        except grpc.aio.AioRpcError as exc:
            if not version_refused(exc) or api is apis[-1]:
                code, details = exc.code().name, exc.details()
                logger.warning("{}: Register ({}) failed: {}: {}", resource.name, api.name, code, details)
                raise RegisterFailed(api.name, f"Register ({api.name}): {code}: {details}") from exc
            logger.info("{}: the kubelet does not speak {}; trying an older version", resource.name, api.name)
    raise RegisterFailed("", "no API version to offer")

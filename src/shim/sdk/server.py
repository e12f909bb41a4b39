"""Serving a Driver: dispatch, params checks, the version check and a clean end.

The Peer (shim.jsonrpc) does the framing and runs each request in its own
task, so a slow preferred_allocation never holds up an allocate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from loguru import logger

from shim import driverprotocol
from shim.driverprotocol import PROTOCOL_VERSION
from shim.jsonrpc import ErrorCode, Peer, Transport
from shim.jsonrpc.peer import Handler
from shim.sdk.codec import decode, device_json, grant_json, message_json
from shim.sdk.driver import OPTIONAL_METHODS, Driver
from shim.sdk.errors import DriverError, InvalidParams, NotImplementedByResource, UnknownResource
from shim.sdk.generated.devshim.driver import v1 as types


def check_protocol_version(theirs: str) -> None:
    """devshim's version, held to driverprotocol's rule."""
    try:
        driverprotocol.check_protocol_version(theirs)
    except driverprotocol.ProtocolVersionRefused as refused:
        if refused.malformed:
            raise InvalidParams("initialize", str(refused)) from None
        raise DriverError(
            ErrorCode.INVALID_REQUEST,
            f"devshim speaks driver protocol {theirs}, this driver {PROTOCOL_VERSION}: majors must be equal",
        ) from None


def capability_mismatches(driver: Driver, resources: list[types.Resource]) -> list[str]:
    """What the optional methods and the resources' flags say that cannot both be meant.

    devshim calls an optional method only for a resource whose flag says so, so an override no
    resource declares is dead code nobody would notice. A driver serving nothing yet (it finds
    its resources later) is not judged: its flags are not known."""
    problems: list[str] = []
    for method in OPTIONAL_METHODS:
        declaring = [r.name for r in resources if getattr(r, method)]
        if declaring and not driver.implements(method):
            problems.extend(
                f"{name} declares {method} but the driver does not implement it" for name in declaring
            )
        elif resources and not declaring and driver.implements(method):
            problems.append(
                f"{type(driver).__name__} overrides {method} but no resource in resources() sets "
                f"{method}=True: devshim will never call it"
            )
    return problems


class _Dispatcher:
    """One handler per method: params in, the driver called, its answer checked and encoded."""

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self.shut_down = asyncio.Event()
        self._finished = False

    def handlers(self) -> dict[str, Handler]:
        devices_methods: dict[str, Callable[[str, list[str]], Awaitable[None]]] = {
            "prestart": self._driver.prestart,
            "deallocate": self._driver.deallocate,
            "post_stop": self._driver.post_stop,
        }
        return {
            "initialize": self._initialize,
            "list_devices": self._list_devices,
            "allocate": self._allocate,
            "preferred_allocation": self._preferred_allocation,
            "attach": self._attach,
            "detach": self._detach,
            **{name: self._devices_method(name, call) for name, call in devices_methods.items()},
            "shutdown": self._shutdown,
        }

    def _resource(self, name: str, optional_method: str | None = None) -> None:
        """Unknown resource: -32003; an optional method it does not declare: -32601."""
        resource = next((r for r in self._driver.resources() if r.name == name), None)
        if resource is None:
            raise UnknownResource(name)
        if optional_method is not None and not getattr(resource, optional_method):
            raise NotImplementedByResource(name, optional_method)

    async def _initialize(self, params: Any) -> dict[str, Any]:
        request = decode(types.InitializeParams, "initialize", params)
        check_protocol_version(request.protocol_version)
        await self._driver.on_initialize(request)
        resources = self._driver.resources()
        for problem in capability_mismatches(self._driver, resources):
            logger.warning("{}", problem)
        info = types.DriverInfo(name=self._driver.display_name, version=self._driver.version)
        return message_json(
            types.InitializeResult(
                protocol_version=PROTOCOL_VERSION,
                driver=info,
                resources=resources,
                cdi_specs=self._driver.cdi_specs(),
            )
        )

    async def _list_devices(self, params: Any) -> dict[str, Any]:
        request = decode(types.ListDevicesParams, "list_devices", params)
        self._resource(request.resource)
        devices = await self._driver.list_devices(request.resource)
        return {"devices": [device_json(d) for d in devices]}

    async def _allocate(self, params: Any) -> dict[str, Any]:
        request = decode(types.AllocateParams, "allocate", params)
        self._resource(request.resource)
        if any(c.shares or c.admin_access for c in request.containers):  # protocol 1.3: DRA's, one
            # container: every container alike, to the method of its capability.
            first = request.containers[0]
            if any(bool(c.shares) != bool(first.shares) or c.admin_access != first.admin_access
                   for c in request.containers):  # fmt: skip
                raise InvalidParams(
                    "allocate", "admin_access or shares is set on some containers but not all"
                )
            capability = "shares" if first.shares else "admin_access"
            self._resource(request.resource, capability)
            unheld = [
                await (self._driver.shares(request.resource, list(c.shares)) if c.shares
                       else self._driver.admin_access(request.resource, list(c.device_ids)))
                for c in request.containers
            ]  # fmt: skip
            return {"containers": [grant_json(g) for g in unheld]}
        containers = [list(c.device_ids) for c in request.containers]
        grants = await self._driver.allocate(request.resource, containers)
        return {"containers": [grant_json(g) for g in grants]}

    async def _attach(self, params: Any) -> dict[str, Any]:
        request = decode(types.AttachParams, "attach", params)
        self._resource(request.resource, "attach")
        conditions = await self._driver.attach(
            request.resource, request.device_id, request.claim, request.claim_uid
        )
        return message_json(types.AttachResult(conditions=conditions))

    async def _detach(self, params: Any) -> dict[str, Any]:
        request = decode(types.AttachParams, "detach", params)
        self._resource(request.resource, "attach")
        await self._driver.detach(request.resource, request.device_id, request.claim, request.claim_uid)
        return {}

    async def _preferred_allocation(self, params: Any) -> dict[str, Any]:
        request = decode(types.PreferredAllocationParams, "preferred_allocation", params)
        self._resource(request.resource, "preferred_allocation")
        chosen = [await self._driver.preferred_allocation(request.resource, c) for c in request.containers]
        return {"containers": [{"device_ids": list(ids)} if ids else {} for ids in chosen]}

    def _devices_method(self, method: str, call: Callable[[str, list[str]], Awaitable[None]]) -> Handler:
        async def handle(params: Any) -> dict[str, Any]:
            request = decode(types.DevicesParams, method, params)
            self._resource(request.resource, method)
            await call(request.resource, list(request.device_ids))
            return {}

        return handle

    async def _shutdown(self, params: Any) -> dict[str, Any]:
        decode(types.ShutdownParams, "shutdown", params)
        await self.finish()
        self.shut_down.set()
        return {}

    async def finish(self) -> None:
        """The driver's on_shutdown, once, whether devshim said shutdown or just went away."""
        if not self._finished:
            self._finished = True
            await self._driver.on_shutdown()


async def serve(driver: Driver, transport: Transport) -> None:
    """Answer devshim over ``transport`` until it says shutdown or the stream ends."""
    dispatcher = _Dispatcher(driver)
    # Not strict: a driver answers garbage with an error object rather than hanging up.
    peer = Peer(transport, name=driver.display_name, requests=dispatcher.handlers(), strict=False)
    driver._attach(peer)
    reading = asyncio.create_task(peer.run())
    shut_down = asyncio.create_task(dispatcher.shut_down.wait())
    try:
        await asyncio.wait([reading, shut_down], return_when=asyncio.FIRST_COMPLETED)
        # Every request read so far, shutdown's own included, is answered before we go.
        await peer.wait_idle()
    finally:
        shut_down.cancel()
        reading.cancel()
        # wait() rather than await: the Peer's own failure is logged by it, not raised here.
        await asyncio.wait([reading])
        try:
            await dispatcher.finish()
        finally:
            driver._attach(None)
            await peer.close()

"""TEST DOUBLE: the version-neutral behaviour of a tiny scripted device plugin.

This is not part of the fake kubelet. It exists to test the fake kubelet itself
(tests/compat/test_fake_kubelet.py): a plugin whose every answer a test can set, and whose every
call is logged. scripted_plugin.ScriptedPlugin puts it on the wire in v1beta1 and/or v1beta2, and
pluginregistration.add_scripted_registration serves a RegistrationScript.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc

from shim.compat.fakekubelet.api import PreferredRequest
from shim.compat.fakekubelet.records import DeviceState, Grant, PluginInfo, PluginOptions

DeviceList = tuple[DeviceState, ...]


class ScriptedFailure(Exception):
    """Raised by a scripted reply: the RPC fails with this status code and details."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@dataclass(frozen=True)
class _EndStream:
    failure: ScriptedFailure | None


def grant_per_container(containers: Sequence[Sequence[str]]) -> list[Grant]:
    """Default Allocate reply: one grant per container naming its devices in an env var."""
    return [Grant(envs={"DEVICES": ",".join(ids)}) for ids in containers]


def prefer_from_the_end(request: PreferredRequest) -> list[str]:
    """Default GetPreferredAllocation reply: must-include first, then the last available ids.

    Deliberately not the kubelet's default pick (the first ids), so a test can tell it was used.
    """
    rest = [device for device in reversed(request.available) if device not in request.must_include]
    return [*request.must_include, *rest][: request.size]


class PluginScript:
    """What a scripted plugin answers, and a log of what it was asked."""

    def __init__(self, *, options: PluginOptions | None = None, devices: Sequence[DeviceState] = ()) -> None:
        self.options = options or PluginOptions()
        self.devices: DeviceList = tuple(devices)
        self.allocate_reply: Callable[[Sequence[Sequence[str]]], Sequence[Grant]] = grant_per_container
        self.preferred_reply: Callable[[PreferredRequest], Sequence[str]] = prefer_from_the_end
        self.prestart_reply: Callable[[Sequence[str]], None] = lambda device_ids: None
        # v1beta2 only (KEP-3162's calls): a reply may raise ScriptedFailure, like the others.
        self.deallocate_reply: Callable[[Sequence[str]], None] = lambda device_ids: None
        self.post_stop_reply: Callable[[Sequence[str]], None] = lambda device_ids: None
        self.allocate_calls: list[list[tuple[str, ...]]] = []
        self.preferred_calls: list[list[PreferredRequest]] = []
        self.prestart_calls: list[tuple[str, ...]] = []
        self.deallocate_calls: list[tuple[str, ...]] = []
        self.post_stop_calls: list[tuple[str, ...]] = []
        self.streams_opened = 0
        self._streams: set[asyncio.Queue[DeviceList | _EndStream]] = set()

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def push(self, devices: Sequence[DeviceState]) -> None:
        """Replace the device list and send it on every open ListAndWatch stream."""
        self.devices = tuple(devices)
        for queue in self._streams:
            queue.put_nowait(self.devices)

    def end_streams(self, failure: ScriptedFailure | None = None) -> None:
        """End every open ListAndWatch stream, with OK or with `failure`."""
        for queue in self._streams:
            queue.put_nowait(_EndStream(failure))

    async def watch(self) -> AsyncIterator[DeviceList]:
        """One ListAndWatch stream: the current list at once, then every pushed one."""
        queue: asyncio.Queue[DeviceList | _EndStream] = asyncio.Queue()
        self._streams.add(queue)
        self.streams_opened += 1
        try:
            yield self.devices
            while True:
                item = await queue.get()
                if isinstance(item, _EndStream):
                    if item.failure is not None:
                        raise item.failure
                    return
                yield item
        finally:
            self._streams.discard(queue)

    def allocate(self, containers: Sequence[Sequence[str]]) -> list[Grant]:
        self.allocate_calls.append([tuple(ids) for ids in containers])
        return list(self.allocate_reply(containers))

    def preferred(self, requests: Sequence[PreferredRequest]) -> list[tuple[str, ...]]:
        self.preferred_calls.append(list(requests))
        return [tuple(self.preferred_reply(request)) for request in requests]

    def prestart(self, device_ids: Sequence[str]) -> None:
        self.prestart_calls.append(tuple(device_ids))
        self.prestart_reply(device_ids)

    def deallocate(self, device_ids: Sequence[str]) -> None:
        self.deallocate_calls.append(tuple(device_ids))
        self.deallocate_reply(device_ids)

    def post_stop(self, device_ids: Sequence[str]) -> None:
        self.post_stop_calls.append(tuple(device_ids))
        self.post_stop_reply(device_ids)


class RegistrationScript:
    """TEST DOUBLE: what a plugin answers on its pluginregistration socket, and what it was told.

    `info` is the GetInfo answer; `info_failure` (when set) fails GetInfo instead and
    `info_delay_s` delays the answer. Every NotifyRegistrationStatus lands in `notifications`
    as (registered, error).
    """

    def __init__(self, info: PluginInfo, *, info_failure: ScriptedFailure | None = None) -> None:
        self.info = info
        self.info_failure = info_failure
        self.info_delay_s = 0.0
        self.info_calls = 0
        self.notifications: list[tuple[bool, str]] = []
        self._changed = asyncio.Condition()

    async def get_info(self) -> PluginInfo:
        self.info_calls += 1
        if self.info_delay_s:
            await asyncio.sleep(self.info_delay_s)
        if self.info_failure is not None:
            raise self.info_failure
        return self.info

    async def notified(self, registered: bool, error: str) -> None:
        self.notifications.append((registered, error))
        async with self._changed:
            self._changed.notify_all()

    async def wait_for_notifications(
        self, count: int = 1, *, timeout: float = 10.0
    ) -> list[tuple[bool, str]]:
        """The notifications received, once there are at least `count`."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(lambda: len(self.notifications) >= count)
            except TimeoutError:
                raise TimeoutError(
                    f"fewer than {count} notifications within {timeout}s: {self.notifications}"
                ) from None
        return list(self.notifications)

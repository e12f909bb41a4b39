"""An API server in memory, for the DRA publisher's tests: the calls PoolPublisher makes, on
slices kept here, with replies and watch events that can be made to race the way a busy node
sees them (tests/unit/test_dra_publisher.py, tests/unit/test_dra_publisher_stateful.py)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from shim.dra.kube import ApiError

Event = tuple[int, str, dict[str, Any]]


class MemoryCollection:
    """One collection's objects by name, each change an event in ``log`` at the next
    resourceVersion (counting up as etcd's revisions do), and watches that deliver the log."""

    def __init__(self) -> None:
        self.version = 0
        self.objects: dict[str, dict[str, Any]] = {}
        self.log: list[Event] = []
        self.delivered = 0  # the last resourceVersion a watcher has taken in (asked for more after)
        self.watching = 0  # watches open now
        self._changed = asyncio.Event()
        self._ending = False  # the open watches are to end...
        self._failure: ApiError | None = None  # ...with this error, if any

    def _store(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        if kind == "DELETED":
            self.objects.pop(obj["metadata"]["name"])
        else:
            self.objects[obj["metadata"]["name"]] = obj
        self.log.append((self.version, kind, copy.deepcopy(obj)))
        self._changed.set()
        return copy.deepcopy(obj)

    def end_watches(self, error: ApiError | None = None) -> None:
        """The API server ends the open watches (their timeout), or fails them with ``error``."""
        self._ending, self._failure = True, error
        self._changed.set()

    async def _watch(self, since: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self._ending = False
        sent = int(since)
        self.watching += 1
        try:
            while True:
                for rv, kind, obj in [e for e in self.log if e[0] > sent]:
                    yield kind, copy.deepcopy(obj)
                    sent = self.delivered = rv
                if self._ending:
                    if self._failure is not None:
                        raise self._failure
                    return
                self._changed.clear()
                await self._changed.wait()
        finally:
            self.watching -= 1


class MemoryApi(MemoryCollection):
    """The calls PoolPublisher makes, on slices kept here. ``before_reply`` runs once a create is
    stored and before its reply is returned."""

    def __init__(self) -> None:
        super().__init__()
        self.slices = self.objects
        self.lists = 0
        self.before_reply: Callable[[dict[str, Any]], Awaitable[None]] | None = None

    async def slice_versions(self) -> list[str]:
        return ["v1"]

    async def minor(self) -> int | None:
        return None  # says no release: devshim writes today's shape

    async def node_uid(self, node: str) -> str | None:
        return None

    async def list_slices(self, version: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return copy.deepcopy(list(self.slices.values())), str(self.version)

    async def create_slice(self, version: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        name = obj["metadata"].pop("generateName") + str(self.version + 1)
        obj["metadata"] |= {"name": name, "uid": f"uid-{name}"}
        created = self._store("ADDED", obj)
        if self.before_reply is not None:
            await self.before_reply(created)
        return created

    async def replace_slice(self, version: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        old = self.slices.get(name)
        if old is None or old["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise ApiError(f"PUT {name}: conflict", 404 if old is None else 409)
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = old["metadata"]["uid"]
        return self._store("MODIFIED", obj)

    async def delete_slice(self, version: str, name: str, uid: str) -> None:
        if name in self.slices:
            self._store("DELETED", copy.deepcopy(self.slices[name]))

    def delete_all(self) -> int:
        """Someone else deletes every slice; the resourceVersion of the last deletion."""
        for name in list(self.slices):
            self._store("DELETED", copy.deepcopy(self.slices[name]))
        return self.version

    def watch_slices(
        self, version: str, selector: str, since: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return self._watch(since)

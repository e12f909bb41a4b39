"""One DRA driver's pool on this node, kept published as ResourceSlices.

Level-triggered: whatever happened (a device list changed, the kubelet deleted the node's slices,
the API server restarted or was upgraded), the publisher lists its own slices, compares them
with the pool it should publish and writes the difference, again until they agree:

- a slice's content is compared through the hash of what devshim meant it to be (an annotation;
  slices.py), the same in every version, so an API server upgrade that renames the version finds
  the slices already right and writes nothing: no device leaves the pool at any moment;
- a change of the pool's content writes every slice with the generation after the highest seen
  (the scheduler ignores slices of older generations) and ``resourceSliceCount`` slices, updating
  the existing ones in place, creating what is missing, and only then deleting what is extra;
- health is not content: an Unhealthy device stays published (docs/dra.md);
- a device whose DRA device name another resource of the pool owns (shim/dra/ownership.py) is
  left out, and the clash is an error, in the log when it starts and in ``last_error`` for as
  long as it lasts, while the rest of the pool is published as usual.

The version is the newest resource.k8s.io version serving ResourceSlices (discovery), found
again whenever a request says it is gone.

The invariant: the slices the API server holds for this node's pool are what devshim would
publish from the devices it serves, again within a bounded time after anything that breaks it:

- a slice deleted or changed by someone else (the kubelet at its start or at a plugin's
  deregistration): the watch's event, COALESCE_S and one round of writes, well under a second;
- the watch ending, however (its timeout, 410 Gone, a dropped connection): the slices are listed
  again before anything else, so a view gone wrong, whatever the cause, lasts at most one watch
  (kube.WATCH_TIMEOUT_S, 240 s). That re-list is the periodic resync: one list of the node's
  slices per watch, served from the API server's cache, rather than a timer of its own;
- the API server unreachable or restarted: at the first round that reaches it again (the backoff,
  at most BACKOFF_S[1] with jitter, after it is back);
- devshim restarted: the first round once the pool is known (shim/dra/node.py, FIRST_POOL_WAIT_S).

What is published is the watch's view (``_observed``), ordered by resourceVersion: a write's
result and the watch's events race (a busy node reads the reply after the events), and the later
resourceVersion of a name wins, a deletion included, so a reply can never bring back a slice
whose deletion the watch already delivered (issue 42, 2). resourceVersions are opaque strings in
the API, integers (etcd's revision) in every API server; where two do not read as integers the
watch, whose events come in order, wins over a reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from shim.dra.kube import ApiError, ApiServer, VersionGone
from shim.dra.ownership import Offer
from shim.dra.slices import (
    BESIDE_SINCE,
    PARTITIONS,
    PARTITIONS_SINCE,
    SPEC_HASH,
    Pool,
    dropped,
    slice_object,
    spec_hash,
)

BACKOFF_S = (0.5, 30.0)  # after a failed round: first wait, longest wait
COALESCE_S = 0.05  # changes arriving this close together are written once
# Slices written at once: a change rewrites every slice of the pool (79 for 10,000 devices), and
# one at a time waits on the API server's round trips (docs/benchmarks.md, row dra).
PARALLEL_WRITES = 4
SHORTEST_WATCH_S = 1.0  # a watch ending sooner is a failure, not its timeout: no list at once


@dataclass
class PublisherStatus:
    driver: str
    node: str
    version: str | None = None
    generation: int = 0
    slices: int = 0
    devices: int = 0
    writes: int = 0  # slices created, replaced or deleted
    rounds: int = 0  # comparisons of the pool with what is published that succeeded
    last_error: str | None = None
    published_at: float | None = None
    # Feature gates whose device fields the API server dropped from the last slice written (off
    # on that server): published without them, and said once in the log.
    dropped: list[str] = field(default_factory=list)


class PoolPublisher:
    """Publishes the devices that ``devices()`` offers (the devices every resource of this DRA
    driver owns; None while they are not all known yet), waking whenever ``changed()`` is called."""

    def __init__(
        self,
        driver: str,
        node: str,
        devices: Callable[[], Offer | None],
        *,
        kubeconfig: Path | None = None,
        connect: Callable[[Path | None], Any] = ApiServer.connect,
        bindings: bool = False,
    ) -> None:
        """``bindings``: publish the devices' binding conditions (a ClaimBinder answers them)."""
        self.status = PublisherStatus(driver, node)
        self._driver, self._node = driver, node
        self._devices = devices
        self._kubeconfig = kubeconfig
        self._connect = connect
        self._dirty = asyncio.Event()
        self._generation = 0  # never goes back, even when every slice was deleted
        self._observed: dict[str, dict[str, Any]] = {}
        # The newest resourceVersion known of each name, a deleted one's too (until no write is
        # in flight: only a write's late reply could still name it).
        self._versions: dict[str, str] = {}
        self._selector = f"spec.driver={driver},spec.nodeName={node}"
        self._clash: str | None = None  # what the offer last said is refused
        self._partitions = True  # the server takes 1.36's shape of partitionable devices
        self._beside = False  # or 1.33-1.35's, the sets in their devices' slices
        self._bindings = bindings
        self._bindings_said = False  # the warning that a pool's binding conditions are left out

    def changed(self) -> None:
        self._dirty.set()

    async def run(self) -> None:
        """Until cancelled; failures are logged and retried with backoff, never raised."""
        wait = BACKOFF_S[0]
        api: ApiServer | None = None
        while True:
            rounds = self.status.rounds
            try:
                api = api or await self._connect(self._kubeconfig)
                await self._serve(api)
            except VersionGone as exc:
                logger.info("DRA {}: {}; finding the version again", self._driver, exc)
                self.status.version = None
                continue
            except ApiError as exc:
                self.status.last_error = str(exc)
                if self.status.rounds != rounds:  # it worked for a while: start the backoff over
                    wait = BACKOFF_S[0]
                logger.warning("DRA {}: {}; trying again in {:.1f}s", self._driver, exc, wait)
            # Jittered: the nodes of a cluster whose API server comes back do not return at once.
            await asyncio.sleep(wait * random.uniform(0.8, 1.2))
            wait = min(wait * 2, BACKOFF_S[1])

    async def _serve(self, api: ApiServer) -> None:
        versions = await api.slice_versions()
        if not versions:
            raise ApiError("the API server serves no resource.k8s.io version with ResourceSlices")
        version = versions[0]
        if version != self.status.version:
            logger.info("DRA {}: publishing ResourceSlices as resource.k8s.io/{}", self._driver, version)
        self.status.version = version
        minor = await api.minor()
        # Partitionable devices in 1.36's shape: never to an older server, nor in v1alpha3.
        self._partitions = version != "v1alpha3" and (minor is None or minor >= PARTITIONS_SINCE)
        # 1.33-1.35: the sets beside their devices (an alpha gate: off, the server drops them).
        self._beside = minor is not None and BESIDE_SINCE <= minor < PARTITIONS_SINCE
        self._partitions |= self._beside
        owner = await api.node_uid(self._node)
        while True:  # a watch that ends, for whatever reason, is followed by a fresh list
            items, since = await api.list_slices(version, self._selector)
            self._observed = {o["metadata"]["name"]: o for o in items}
            self._versions = {n: _version(o) for n, o in self._observed.items()}
            started = time.monotonic()
            try:
                await self._follow(api, version, owner, since)
            except ApiError as exc:
                if exc.http_status != 410:
                    raise
                logger.info("DRA {}: the watch's resourceVersion is gone (410); listing again", self._driver)
                continue
            if time.monotonic() - started < SHORTEST_WATCH_S:  # not the timeout: through the backoff
                raise ApiError("the watch of the node's slices ended as soon as it began")

    async def _follow(self, api: ApiServer, version: str, owner: str | None, since: str) -> None:
        """Reconciles on every change until the watch from ``since`` ends (returns) or fails."""
        watching = asyncio.create_task(self._watch(api, version, since))
        try:
            self._dirty.set()
            while await self._wait_for_change(watching):
                if await self._reconcile(api, version, owner):
                    self.status.rounds += 1
                self.status.last_error = self._clash  # set while a clash lasts, whatever was written
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await watching

    async def _wait_for_change(self, watching: asyncio.Task[None]) -> bool:
        """True once the pool is to be looked at; False once the watch has ended (its failure,
        raised)."""
        waiting = asyncio.create_task(self._dirty.wait())
        try:
            await asyncio.wait({waiting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if watching.done():
            watching.result()
            return False
        await asyncio.sleep(COALESCE_S)
        self._dirty.clear()
        return True

    async def _watch(self, api: ApiServer, version: str, since: str) -> None:
        """Keeps _observed current until the API server ends the watch; every change by anyone
        marks the pool for a look."""
        async for kind, obj in api.watch_slices(version, self._selector, since):
            name = obj.get("metadata", {}).get("name")
            if kind == "BOOKMARK" or not name:
                continue
            self._saw(name, None if kind == "DELETED" else obj, _version(obj), replied=False)
            self._dirty.set()

    def _saw(self, name: str, obj: dict[str, Any] | None, version: str, *, replied: bool) -> None:
        """``obj`` (None: deleted) as the state of ``name`` at ``version``, unless a later state is
        known already."""
        known = self._versions.get(name)
        if known is not None and not _later(version, known, unknown=not replied):
            return
        self._versions[name] = version
        if obj is None:
            self._observed.pop(name, None)
        else:
            self._observed[name] = obj

    async def _reconcile(self, api: ApiServer, version: str, owner: str | None) -> bool:
        """Make the published pool the wanted one; False if the pool is not known yet (nothing
        compared, nothing written)."""
        offer = self._devices()
        if offer is None:  # not every resource of the pool is known yet: wait, write nothing
            return False
        if offer.problem != self._clash:
            if offer.problem is not None:
                logger.error("DRA {}: {}; the rest of the pool is published", self._driver, offer.problem)
            else:
                logger.info("DRA {}: no device names clash in the pool any more", self._driver)
            self._clash = offer.problem
        pool = Pool.named(
            self._driver, self._node, offer.devices, self._partitions, self._bindings, self._beside
        )
        if pool.bindings_unpublished() and not self._bindings_said:
            logger.warning(
                "DRA {}: devices declare binding conditions, published without them: "
                "dra.drivers[].binding_conditions is off, so pods using them bind without an attach",
                self._driver,
            )
            self._bindings_said = True
        chunks = pool.chunks()
        observed = sorted(self._observed.values(), key=lambda o: o["metadata"]["name"])
        seen = max((_generation(o) for o in observed), default=0)
        self._generation = max(self._generation, seen)
        wanted = sorted(spec_hash(pool, c, self._generation, len(chunks)) for c in chunks)
        if sorted(_hash(o) for o in observed) == wanted:
            self._published(pool, len(chunks))
            return True
        self._generation += 1
        generation, count = self._generation, len(chunks)
        writing = asyncio.Semaphore(PARALLEL_WRITES)
        lost: set[str] = {PARTITIONS} if pool.counters_unpublished() else set()  # gates whose fields
        # the server dropped from a slice written, or devshim left out for it

        async def write(index: int) -> None:
            body = slice_object(pool, chunks[index], generation, count, version)
            if owner:
                body["metadata"]["ownerReferences"] = [
                    {"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": owner, "controller": True}
                ]
            async with writing:
                if index < len(observed):
                    old = observed[index]["metadata"]
                    body["metadata"] |= {"name": old["name"], "resourceVersion": old["resourceVersion"]}
                    del body["metadata"]["generateName"]
                    written = await api.replace_slice(version, old["name"], body)
                else:
                    written = await api.create_slice(version, body)
            # Not unconditionally: the watch may have delivered this slice's deletion already.
            self._saw(written["metadata"]["name"], written, _version(written), replied=True)
            self.status.writes += 1
            lost.update(dropped(body["spec"], written.get("spec"), version))

        try:
            await _all(write(i) for i in range(count))
            self._dropped(sorted(lost))
            for extra in observed[count:]:  # only once the new generation is whole
                name = extra["metadata"]["name"]
                await api.delete_slice(version, name, extra["metadata"]["uid"])
                self._observed.pop(name, None)
                self.status.writes += 1
        finally:  # no write in flight: a deleted name can come up no more
            self._versions = {n: v for n, v in self._versions.items() if n in self._observed}
        logger.info(
            "DRA {}: pool {} generation {}: {} devices in {} slices",
            self._driver, self._node, generation, len(pool.devices), count,
        )  # fmt: skip
        self._published(pool, count)
        return True

    def _dropped(self, gates: list[str]) -> None:
        if gates and gates != self.status.dropped:
            logger.warning(
                "DRA {}: the slices devshim wrote carry nothing that needs the feature gate {}: the "
                "API server dropped it (the gate off there) or predates the shape devshim writes; "
                "the scheduler does not see it",
                self._driver, ", ".join(gates),
            )  # fmt: skip
        self.status.dropped = gates

    def _published(self, pool: Pool, count: int) -> None:
        self.status.generation = self._generation
        self.status.slices = count
        self.status.devices = len(pool.devices)
        self.status.published_at = time.time()


async def _all(writes: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Every write, or the first failure once all have ended (none is left running)."""
    results = await asyncio.gather(*writes, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def _generation(obj: dict[str, Any]) -> int:
    value = obj.get("spec", {}).get("pool", {}).get("generation", 0)
    return value if isinstance(value, int) else 0


def _hash(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata", {}).get("annotations") or {}).get(SPEC_HASH, ""))


def _version(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


def _later(version: str, than: str, *, unknown: bool) -> bool:
    """Whether resourceVersion ``version`` is after ``than``; ``unknown`` where they do not both
    read as integers (the API calls them opaque; etcd makes them its revisions)."""
    if version.isdigit() and than.isdigit():
        return int(version) > int(than)
    return unknown

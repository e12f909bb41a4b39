"""DRA binding conditions: devices that need an attach step before a pod using them binds.

The scheduler allocates such a device to a claim (the result carries the device's
``bindingConditions`` and ``bindingFailureConditions``), then waits before binding the pod,
reading the claim every few seconds, until every condition is True in the claim's
``status.devices`` entry for the device; a failure condition True makes it free the claim and
place the pod again, and so does its ``bindingTimeout`` (10 minutes by default). devshim knows
the device, so for a DRA driver whose config sets ``binding_conditions`` it watches the claims,
asks the device's driver to attach (protocol 1.4) once per allocation, and writes the answer.

The invariant: every result allocated from this node's pool with binding conditions gets a
``status.devices`` entry holding the driver's answer, or, where the driver failed (an error, a
timeout, a device it no longer serves), the first failure condition True with the reason; within
one attach timeout of the allocation being seen, again after any failure to reach the API
server. An entry answered already (before devshim restarted) is not asked for again, and an
answer for an allocation that has gone or changed meanwhile is not written. An allocation asked
to attach is detached (the driver's detach) once it is gone, freed or its claim deleted, also when
that happened while devshim was down (dra/attached.py keeps them)
(tests/unit/test_dra_binding_stateful.py searches event orders for a violation).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from shim.core.api import ClaimResource
from shim.dra.attached import AttachedStore, Attachment
from shim.dra.kube import ApiError, ApiServer
from shim.dra.ownership import Ownership
from shim.driverprotocol import MAX_CONDITION_MESSAGE
from shim.errors import ShimError
from shim.model import BindingCondition

BACKOFF_S = (0.5, 30.0)  # after a failed round: first wait, longest wait
PARALLEL_ATTACHES = 8  # attaches in flight at once, over every claim
WRITE_TRIES = 5  # a status write that meets a newer claim (409) reads it again, this often
SHORTEST_WATCH_S = 1.0
# Binding conditions came with 1.34's v1beta1, v1beta2 and v1: never v1alpha3.
VERSIONS = ("v1", "v1beta2", "v1beta1")

# (claim uid, allocationTimestamp, device, shareID): one allocation of one device.
Key = tuple[str, str, str, str]


@dataclass
class BindingStatus:
    attached: int = 0  # answers written
    failed: int = 0  # of those, the driver's failure said as a failure condition
    last_error: str | None = None


class ClaimBinder:
    """Answers the binding conditions of one DRA driver's pool on this node."""

    def __init__(
        self,
        driver: str,
        node: str,
        owners: Callable[[], Ownership],
        services: Callable[[], Mapping[str, ClaimResource]],
        *,
        kubeconfig: Path | None = None,
        connect: Callable[[Path | None], Any] = ApiServer.connect,
        pool_known: asyncio.Event | None = None,
        store: AttachedStore | None = None,
    ) -> None:
        """``pool_known``: set once every resource of the pool is served (shim/dra/node.py): a
        claim read before then could name a device devshim does not know yet, not one it lacks.
        ``store``: where the allocations asked to attach are kept until detached (dra/attached.py)."""
        self.status = BindingStatus()
        self._store = store or AttachedStore(None, driver)
        self._attached = {a.key: a for a in self._store.load()}
        self._detaching: dict[Key, asyncio.Task[None]] = {}
        self._driver, self._node = driver, node
        self._owners, self._services = owners, services
        self._kubeconfig, self._connect = kubeconfig, connect
        self._answered: dict[str, set[Key]] = {}  # by claim uid: forgotten when the claim goes
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._parallel = asyncio.Semaphore(PARALLEL_ATTACHES)
        self._pool_known = pool_known

    async def run(self) -> None:
        """Until cancelled; failures are logged and retried with backoff, never raised."""
        wait = BACKOFF_S[0]
        api: ApiServer | None = None
        if self._pool_known is not None:
            await self._pool_known.wait()
        try:
            while True:
                try:
                    api = api or await self._connect(self._kubeconfig)
                    await self._serve(api)
                    wait = BACKOFF_S[0]
                except ApiError as exc:
                    self.status.last_error = str(exc)
                    logger.warning("DRA {}: claims: {}; trying again in {:.1f}s", self._driver, exc, wait)
                await asyncio.sleep(wait * random.uniform(0.8, 1.2))
                wait = min(wait * 2, BACKOFF_S[1])
        finally:
            tasks = [*self._running.values(), *self._detaching.values()]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, api: ApiServer) -> None:
        served = await api.served_versions("resourceclaims")
        versions = [v for v in served if v in VERSIONS]
        if not versions:
            raise ApiError("the API server serves ResourceClaims in no version with binding conditions")
        version = versions[0]
        while True:  # a watch that ends is followed by a fresh list: nothing missed in between
            items, since = await api.list_claims(version)
            live = {str(c.get("metadata", {}).get("uid", "")): c for c in items}
            for key in [k for k in self._attached if k not in _allocated_keys(k[0], live.get(k[0], {}))]:
                self._detach(key)  # freed or deleted since: while devshim was down, say
            for claim in items:
                self._consider(api, version, claim)
            started = time.monotonic()
            try:
                async for kind, claim in api.watch_claims(version, since):
                    if kind == "DELETED":
                        uid = str(claim.get("metadata", {}).get("uid"))
                        self._answered.pop(uid, None)
                        for key in [k for k in self._attached if k[0] == uid]:
                            self._detach(key)
                    elif kind in ("ADDED", "MODIFIED"):
                        self._consider(api, version, claim)
            except ApiError as exc:
                if exc.http_status != 410:
                    raise
                continue
            if time.monotonic() - started < SHORTEST_WATCH_S:
                raise ApiError("the watch of ResourceClaims ended as soon as it began")

    def _consider(self, api: ApiServer, version: str, claim: dict[str, Any]) -> None:
        uid = str(claim.get("metadata", {}).get("uid", ""))
        keys = {_key(uid, claim, r): r for r in _waiting(claim, self._driver, self._node)}
        allocated = set(_allocated_keys(uid, claim))
        answered = self._answered.pop(uid, set()) & allocated
        if answered:  # an allocation gone or changed is forgotten
            self._answered[uid] = answered
        for key in [k for k in self._attached if k[0] == uid and k not in allocated]:
            self._detach(key)  # and what was attached for it is detached
        for key, result in keys.items():
            if key in answered or key in self._running:
                continue
            task = asyncio.create_task(self._answer(api, version, claim, result, key))
            self._running[key] = task

    async def _answer(
        self, api: ApiServer, version: str, claim: dict[str, Any], result: dict[str, Any], key: Key
    ) -> None:
        try:
            async with self._parallel:
                conditions = await self._attach(claim, result)
                if await self._write(api, version, claim, key, result, conditions):
                    self._answered.setdefault(key[0], set()).add(key)
        except ApiError as exc:  # the next list (after the watch ends, or fails) asks again
            self.status.last_error = str(exc)
            logger.warning("DRA {}: binding conditions of {}: {}", self._driver, _ref(claim), exc)
        finally:
            self._running.pop(key, None)

    async def _attach(self, claim: dict[str, Any], result: dict[str, Any]) -> tuple[BindingCondition, ...]:
        """The driver's answer for the result's device, or its failure as a failure condition."""
        name = str(result.get("device"))
        try:
            owner = self._owners().names.get(name)
            service = self._services().get(owner[0]) if owner is not None else None
            if owner is None or service is None:
                raise ShimError(f"device {name!r} is not one devshim serves in the pool now")
            meta = claim["metadata"]
            uid = str(meta.get("uid", ""))
            # Kept before asking: a devshim killed mid-attach still detaches it later.
            kept = Attachment(_ref(claim), uid, *_key(uid, claim, result)[1:], owner[0], owner[1])
            self._attached[kept.key] = kept
            await asyncio.to_thread(self._store.save, list(self._attached.values()))
            answer = await service.attach(owner[1], _ref(claim), uid)
        except ShimError as exc:
            failures = result.get("bindingFailureConditions") or []
            logger.warning("DRA {}: attaching {} for {}: {}", self._driver, name, _ref(claim), exc)
            self.status.failed += 1
            said = str(exc)[:MAX_CONDITION_MESSAGE]
            if failures:
                return (BindingCondition(str(failures[0]), True, "AttachFailed", said),)
            return tuple(
                BindingCondition(str(c), False, "AttachFailed", said) for c in result["bindingConditions"]
            )
        logger.info(
            "DRA {}: {} attached for {}: {}", self._driver, name, _ref(claim),
            ", ".join(f"{c.type}={c.status}" for c in answer) or "no condition set",
        )  # fmt: skip
        return answer

    def _detach(self, key: Key) -> None:
        if key not in self._detaching:
            self._detaching[key] = asyncio.create_task(self._detached(self._attached[key]))

    async def _detached(self, kept: Attachment) -> None:
        """The driver asked to detach ``kept``'s device; forgotten once it answers (else the next
        list asks again)."""
        try:
            service = self._services().get(kept.resource)
            if service is None:
                raise ShimError(f"{kept.resource} is not served now")
            async with self._parallel:
                await service.detach(kept.device_id, kept.claim, kept.uid)
            logger.info("DRA {}: {} detached, {}'s allocation gone", self._driver, kept.device, kept.claim)
            self._attached.pop(kept.key, None)
            await asyncio.to_thread(self._store.save, list(self._attached.values()))
        except ShimError as exc:
            self.status.last_error = f"detaching {kept.device} of {kept.claim}: {exc}"
            logger.warning("DRA {}: {}; trying again at the next list", self._driver, self.status.last_error)
        finally:
            self._detaching.pop(kept.key, None)

    async def _write(
        self,
        api: ApiServer,
        version: str,
        seen: dict[str, Any],
        key: Key,
        result: dict[str, Any],
        conditions: tuple[BindingCondition, ...],
    ) -> bool:
        """The answer into the claim's status.devices, if the claim still holds this allocation
        (False: it does not, and nothing was written)."""
        namespace, name = _ref(seen).split("/", 1)
        for _ in range(WRITE_TRIES):
            claim = await api.get_claim(version, namespace, name)
            if key not in _allocated_keys(key[0], claim):
                return False
            _set_conditions(claim, self._driver, self._node, result, conditions)
            try:
                await api.replace_claim_status(version, claim)
            except ApiError as exc:
                if exc.http_status == 409:
                    continue
                raise
            self.status.attached += 1
            return True
        raise ApiError(f"the status of claim {namespace}/{name} kept changing: {WRITE_TRIES} writes refused")


def _ref(claim: dict[str, Any]) -> str:
    meta = claim.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _allocation(claim: dict[str, Any]) -> dict[str, Any]:
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    return allocation if isinstance(allocation, dict) else {}


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    devices = _allocation(claim).get("devices")
    results = devices.get("results") if isinstance(devices, dict) else None
    return [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []


def _key(uid: str, claim: dict[str, Any], result: dict[str, Any]) -> Key:
    allocated = str(_allocation(claim).get("allocationTimestamp", ""))
    return (uid, allocated, str(result.get("device")), str(result.get("shareID") or ""))


def _allocated_keys(uid: str, claim: dict[str, Any]) -> list[Key]:
    if str(claim.get("metadata", {}).get("uid", "")) != uid:
        return []
    return [_key(uid, claim, r) for r in _results(claim)]


def _entry_of(
    status: dict[str, Any], driver: str, pool: str, result: dict[str, Any]
) -> dict[str, Any] | None:
    for entry in status.get("devices") or ():
        if isinstance(entry, dict) and (
            entry.get("driver"),
            entry.get("pool"),
            entry.get("device"),
            entry.get("shareID"),
        ) == (driver, pool, result.get("device"), result.get("shareID")):
            return entry
    return None


def _waiting(claim: dict[str, Any], driver: str, pool: str) -> list[dict[str, Any]]:
    """The claim's results from this pool with binding conditions none of which is answered yet."""
    status = claim.get("status")
    status = status if isinstance(status, dict) else {}
    waiting = []
    for result in _results(claim):
        conditions = result.get("bindingConditions")
        if result.get("driver") != driver or result.get("pool") != pool or not isinstance(conditions, list):
            continue
        if not conditions:
            continue
        named = set(map(str, conditions)) | set(map(str, result.get("bindingFailureConditions") or ()))
        entry = _entry_of(status, driver, pool, result)
        said = {c.get("type") for c in (entry or {}).get("conditions") or () if isinstance(c, dict)}
        if not said & named:
            waiting.append(result)
    return waiting


def _set_conditions(
    claim: dict[str, Any],
    driver: str,
    pool: str,
    result: dict[str, Any],
    conditions: tuple[BindingCondition, ...],
) -> None:
    status = claim.setdefault("status", {})
    entry = _entry_of(status, driver, pool, result)
    if entry is None:
        entry = {"driver": driver, "pool": pool, "device": result["device"]}
        if result.get("shareID"):
            entry["shareID"] = result["shareID"]
        status["devices"] = [*(status.get("devices") or ()), entry]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kept = {c.get("type"): c for c in entry.get("conditions") or () if isinstance(c, dict)}
    for condition in conditions:
        kept[condition.type] = {
            "type": condition.type,
            "status": "True" if condition.status else "False",
            "reason": condition.reason or "DriverAnswered",
            "message": condition.message,
            "lastTransitionTime": now,
            "observedGeneration": claim.get("metadata", {}).get("generation", 0),
        }
    entry["conditions"] = list(kept.values())

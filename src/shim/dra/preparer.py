"""NodePrepareResources and NodeUnprepareResources for one DRA driver, version-neutral.

How a claim maps onto the device plugin's model (docs/dra.md, "From the device plugin to a
claim"): a claim is prepared once on a node, however many containers and pods share it, and
its devices of one resource are asked of the driver together, as one container's Allocate
(so a grant such as ``VISIBLE_DEVICES=a,b`` comes out whole), then checked against the
resource's grant policy; the driver's pre-start runs once per preparation, its deallocate at
unprepare. Each grant becomes one CDI device, and every device of the claim answered to the
kubelet carries the CDI IDs of its resource's grant (and any CDI names the grant itself gives).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from loguru import logger

from shim import cdi
from shim.cdi import has_edits
from shim.core.api import ClaimResource
from shim.dra.checkpoint import Checkpoint, Entry, Group, PreparedDevice
from shim.dra.claims import Allocated, ClaimProblem, ClaimRef, allocated
from shim.dra.ownership import PoolOwners
from shim.errors import ShimError
from shim.model import ContainerGrant
from shim.slices import give_way

ReadClaim = Callable[[ClaimRef], Awaitable[Any]]
# Claims prepared or unprepared at once, per DRA driver. A node starting many pods sends many
# calls together, and each claim costs devshim's loop a few ms of CPU (its read from the API
# server, the driver's call, two files): with 8 at once the loop stayed busy and another
# resource's Allocate p99 was 4.8-6.7x quiet (17 ms); with 2, each giving way to other ready
# work first (shim/slices.py) while others wait, 5.6-6.8 ms, 1.72-2.25x quiet at 161-188 claims a
# second; with 1, 4.1-6.8 ms, 0.98-1.83x at 124-142 a second (bench/dra_flood.py, six runs each
# way on the 2-core VM): the device plugin's Allocate goes first.
CLAIMS_AT_ONCE = 1


@dataclass(frozen=True, slots=True)
class Outcome:
    """One claim's answer: its devices, or the error that fails it (the kubelet retries)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimPreparer:
    def __init__(
        self,
        driver: str,
        pool: str,
        owners: PoolOwners,
        services: Callable[[], Mapping[str, ClaimResource]],
        read_claim: ReadClaim,
        specs: cdi.SpecDir,
        checkpoint: Checkpoint,
    ) -> None:
        self.driver, self.pool = driver, pool
        self._owners = owners  # the publisher's: a claim's device is prepared by the resource published
        self._services = services
        self._read_claim = read_claim
        self._specs = specs
        self._checkpoint = checkpoint
        self._locks: dict[str, asyncio.Lock] = {}
        self._slots = asyncio.Semaphore(CLAIMS_AT_ONCE)
        self._pending = 0  # claims being prepared or unprepared, or waiting their turn

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """Each claim by uid: prepared (or found prepared: the same answer again) or failed."""
        return await self._each(claims, self._prepare)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """Each claim by uid: undone (a claim not prepared here is already undone) or failed."""
        return await self._each(claims, self._unprepare)

    async def _each(
        self, claims: Sequence[ClaimRef], step: Callable[[ClaimRef], Awaitable[tuple[PreparedDevice, ...]]]
    ) -> dict[str, Outcome]:
        async def one(ref: ClaimRef) -> Outcome:
            if (problem := ref.problem()) is not None:
                logger.warning("DRA driver {}: the kubelet named a claim wrongly: {}", self.driver, problem)
                return Outcome(error=problem)
            self._pending += 1
            try:
                async with self._locks.setdefault(ref.uid, asyncio.Lock()), self._slots:
                    # DRA's one boundary: an error becomes the claim's error string, as DRA's protocol
                    # answers it (a gRPC status, errors.grpc_status, is the device plugin API's answer).
                    try:
                        if self._pending > 1:  # claims at once: other calls go first (a lone
                            await give_way()  # claim does not pay the pause)
                        return Outcome(devices=await step(ref))
                    except (ShimError, OSError) as exc:  # ClaimProblem and ApiError are ShimErrors
                        logger.warning("DRA driver {}: claim {}: {}", self.driver, ref, exc)
                        return Outcome(error=str(exc))
            finally:
                self._pending -= 1

        if len(claims) == 1:  # the usual call (a pod's one claim): no task to wait a turn for
            outcomes = [await one(claims[0])]
        else:
            outcomes = await asyncio.gather(*(one(ref) for ref in claims))
        for ref in claims:
            lock = self._locks.get(ref.uid)
            if lock is not None and not lock.locked():
                del self._locks[ref.uid]
        return {ref.uid: outcome for ref, outcome in zip(claims, outcomes, strict=True)}

    # --- prepare -------------------------------------------------------------

    async def _prepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        entry = self._checkpoint.get(ref.uid)
        this_boot = entry is not None and self._checkpoint.of_this_boot(entry)
        if entry is not None and this_boot and entry.devices is not None:
            # Prepared before (this devshim, or one before a restart): the same answer, its spec
            # put back if the CDI folder lost it (the kubelet asks again after its own restart).
            self._restore_spec(ref.uid, entry)
            return entry.devices
        try:
            claim = await self._read_claim(ref)
        except Exception as exc:  # the API client's errors, said as they are
            raise ClaimProblem(f"cannot read claim {ref}: {exc}") from None
        results = allocated(claim, ref, self.driver, self.pool)
        names = self._owners().names
        groups = self._groups(ref, results, names)
        if entry is not None and this_boot:  # a preparation cut short (devshim stopped): undo it
            await self._undo(ref, entry.groups)
        elif entry is not None:  # made before the node rebooted, which reset its devices
            logger.info("DRA driver {}: claim {}: prepared before the node rebooted; again", self.driver, ref)
            await self._forget(ref, entry.groups)
        boot_id = self._checkpoint.boot_id
        # In the file before the driver is asked, not synced: only this boot reads a preparing
        # claim back (after a power cut, a reboot, nothing of a preparation is undone).
        await self._checkpoint.put(
            ref.uid, Entry(ref.namespace, ref.name, groups, None, boot_id), sync="boot"
        )
        grants: list[ContainerGrant] = []
        try:
            for group in groups:
                service = self._service(group.resource)
                grants.append(
                    await service.prepare(
                        group.device_ids, f"claim {ref}", admin_access=group.admin_access, shares=group.shares
                    )
                )
            cdi_devices = [
                cdi.CdiDevice(cdi.device_name(ref.uid, i), grant)
                for i, grant in enumerate(grants)
                if has_edits(grant)
            ]
            spec = cdi.spec(self.driver, cdi_devices) if cdi_devices else None
            devices = self._answer(ref, results, names, groups, grants)
            # Neither the spec nor the prepared entry waits for the disk: both are written whole
            # on the loop, a page-cache copy each (synced writes, and a thread's hop on a busy
            # node, were half of a prepare). The spec is read in this boot only; the entry is
            # synced right after, in the background, since after a reboot it holds the claim's
            # devices until the kubelet prepares it again (a power cut in those milliseconds
            # loses that hold only). A devshim stopped between the two puts the spec back at start.
            if spec is not None:
                self._specs.write(self.driver, ref.uid, spec)
            prepared = Entry(ref.namespace, ref.name, groups, devices, boot_id, spec)
            await self._checkpoint.put(ref.uid, prepared, sync="soon")
        except BaseException:
            await self._undo(ref, groups[: len(grants)])
            self._specs.remove(self.driver, ref.uid)  # an unlink: no sync to wait for
            await self._checkpoint.drop(ref.uid)
            raise
        logger.info(
            "DRA driver {}: claim {} prepared: {}", self.driver, ref, ", ".join(d.device for d in devices)
        )
        return devices

    def _groups(
        self, ref: ClaimRef, results: Sequence[Allocated], names: Mapping[str, tuple[str, str]]
    ) -> tuple[Group, ...]:
        # One group a resource, and apart from it its devices a request with admin access asked for;
        # each share of a shared device a group of its own (a claim may hold two shares of one).
        by_resource: dict[tuple[str, bool], dict[str, None]] = {}
        shared: list[Group] = []
        for result in results:
            found = names.get(result.device)
            if found is None:
                raise ClaimProblem(
                    f"claim {ref}: device {result.device!r} is not among the devices devshim serves in "
                    f"pool {self.pool} of {self.driver} now (a driver still starting, or a device gone)"
                )
            resource, device_id = found
            if result.share is not None:
                share = replace(result.share, device_id=device_id)
                shared.append(Group(resource, (device_id,), result.admin_access, (share,)))
                continue
            by_resource.setdefault((resource, result.admin_access), {})[device_id] = None
        plain = [Group(r, tuple(ids), admin) for (r, admin), ids in sorted(by_resource.items())]
        return (*plain, *shared)

    def _answer(
        self,
        ref: ClaimRef,
        results: Sequence[Allocated],
        names: Mapping[str, tuple[str, str]],
        groups: Sequence[Group],
        grants: Sequence[ContainerGrant],
    ) -> tuple[PreparedDevice, ...]:
        index = {(g.resource, g.admin_access): i for i, g in enumerate(groups) if not g.shares}
        by_share = {g.shares[0].share_id: i for i, g in enumerate(groups) if g.shares}
        answer = []
        for result in results:
            share = result.share
            i = by_share[share.share_id] if share else index[names[result.device][0], result.admin_access]
            grant = grants[i]
            ours = (cdi.CdiDevice(cdi.device_name(ref.uid, i), grant).qualified(self.driver),)
            ids = (ours if has_edits(grant) else ()) + grant.cdi_devices
            answer.append(
                PreparedDevice(
                    (result.request,), self.pool, result.device, ids, share.share_id if share else None
                )
            )
        return tuple(answer)

    def _service(self, resource: str) -> ClaimResource:
        service = self._services().get(resource)
        if service is None:
            raise ClaimProblem(f"resource {resource} of DRA driver {self.driver} is not served now")
        return service

    def _restore_spec(self, uid: str, entry: Entry) -> None:
        if entry.cdi_spec is not None and not self._specs.has(self.driver, uid):
            path = self._specs.write(self.driver, uid, entry.cdi_spec)
            logger.warning(
                "DRA driver {}: claim {}/{}: its CDI spec was gone; written again: {}",
                self.driver, entry.namespace, entry.name, path,
            )  # fmt: skip

    def restore_specs(self) -> None:
        """At start: the CDI spec of every claim prepared in this boot, put back where the CDI
        folder lost it (a container of a running pod that restarts resolves its devices again,
        and the kubelet, still running, does not prepare its claim again)."""
        for uid, entry in self._checkpoint:
            if entry.prepared and self._checkpoint.of_this_boot(entry):
                try:
                    self._restore_spec(uid, entry)
                except OSError as exc:  # said; the next prepare of the claim tries again
                    logger.error("DRA driver {}: claim {}: CDI spec not put back: {}", self.driver, uid, exc)

    async def _forget(self, ref: ClaimRef, groups: Sequence[Group]) -> None:
        """A preparation of an earlier boot: its devices are held no more, and the driver is not
        asked to deallocate what it did not allocate in this boot."""
        for group in groups:
            service = self._services().get(group.resource)
            if service is not None and not group.admin_access:
                await service.claim_gone(group.device_ids, f"claim {ref}")

    async def _undo(self, ref: ClaimRef, groups: Sequence[Group]) -> None:
        """Best effort, for a preparation that failed: the kubelet will prepare again."""
        claim = f"claim {ref}"
        for group in groups:
            try:
                service = self._service(group.resource)
            except ClaimProblem:
                continue
            try:
                await service.unprepare(
                    group.device_ids, claim, admin_access=group.admin_access, shares=group.shares
                )
            except ShimError as exc:
                logger.warning(
                    "DRA driver {}: deallocate of {} after a failed prepare: {}",
                    self.driver, ", ".join(group.device_ids), exc,
                )  # fmt: skip
                await service.claim_gone(group.device_ids, claim)  # not prepared: nothing holds them

    # --- unprepare -----------------------------------------------------------

    async def _unprepare(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        entry = self._checkpoint.get(ref.uid)
        if entry is None:
            # Never prepared here, undone already, or prepared before the state folder was lost:
            # a spec left from then must not outlive the kubelet's word that the claim is done.
            self._specs.remove(self.driver, ref.uid)
            return ()
        if not self._checkpoint.of_this_boot(entry):  # prepared before the node rebooted
            await self._forget(ref, entry.groups)
        else:
            for group in entry.groups:
                await self._service(group.resource).unprepare(
                    group.device_ids, f"claim {ref}", admin_access=group.admin_access, shares=group.shares
                )
        self._specs.remove(self.driver, ref.uid)
        await self._checkpoint.drop(ref.uid)
        logger.info("DRA driver {}: claim {} unprepared", self.driver, ref)
        return ()

    async def flush(self) -> None:
        """Until the checkpoint is on disk (devshim stopping)."""
        await self._checkpoint.flush()

    def prepared(self) -> int:
        return sum(1 for _, entry in self._checkpoint if entry.prepared)

    def holding(self, resource: str) -> dict[str, str]:
        """Device ID -> the claim that holds it, of ``resource``, as checkpointed (a claim
        preparing when devshim stopped too: its devices may be allocated; an admin-access claim
        holds none)."""
        return {
            device_id: f"claim {entry.namespace}/{entry.name} ({uid})"
            for uid, entry in self._checkpoint
            for group in entry.groups
            if group.resource == resource and not group.admin_access and not group.shares
            for device_id in group.device_ids
        }

    def sharing(self, resource: str) -> dict[str, set[str]]:
        """Device ID -> the claims holding shares of it, of ``resource``, as checkpointed."""
        found: dict[str, set[str]] = {}
        for uid, entry in self._checkpoint:
            for group in entry.groups:
                if group.resource == resource and group.shares and not group.admin_access:
                    for device_id in group.device_ids:
                        found.setdefault(device_id, set()).add(
                            f"claim {entry.namespace}/{entry.name} ({uid})"
                        )
        return found

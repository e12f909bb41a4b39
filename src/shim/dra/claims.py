"""What a ResourceClaim, as the API server holds it, asks of one DRA driver on one node.

Pure. ``status.allocation.devices.results`` and ``status.reservedFor`` have the same shape in
every resource.k8s.io version devshim reads (v1alpha3 through v1: k8s.io/api resource/<version>
types.go): each result names its request, driver, pool and device, and each consumer is an
object reference (``resource: pods``, name, uid).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import grpc

from shim.driverprotocol import MAX_ATTRIBUTES_AND_CAPACITIES, qualified_name_problem, quantity_problem
from shim.errors import ShimError
from shim.facts import is_dns_label, is_dns_subdomain
from shim.model import DeviceShare

# What the kubelet names a claim by becomes an API path (namespace, name) and a file name and
# CDI device name (uid): each held to Kubernetes' own rules before any use.
_UID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,62}[A-Za-z0-9])?")  # a UUID, and then some


class ClaimProblem(ShimError):
    """The claim cannot be prepared here, and why (the kubelet shows it and retries): the claim's
    state (not allocated, reserved for no pod, another node's pool, a device not served now), not
    a fault of devshim's. DRA answers it as a per-claim error string (shim/dra/preparer.py), not
    as a gRPC status; ``status`` is what it would be as one."""

    status = grpc.StatusCode.FAILED_PRECONDITION


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"

    def problem(self) -> str | None:
        """Why the kubelet's reference cannot name a claim, or None."""
        if not is_dns_label(self.namespace):
            return f"{self.namespace[:80]!r} is not a namespace"
        if not is_dns_subdomain(self.name):
            return f"{self.name[:80]!r} is not a ResourceClaim name"
        if not _UID.fullmatch(self.uid):
            return f"{self.uid[:80]!r} is not a uid"
        return None


@dataclass(frozen=True, slots=True)
class Allocated:
    """One device the scheduler allocated to the claim from this driver's pool on this node."""

    request: str
    device: str  # the DRA device name (shim/dra/names.py)
    admin_access: bool = False  # the result's adminAccess: the device may be in use by others
    share: DeviceShare | None = None  # the result's shareID and consumedCapacity: a shared device


def allocated(claim: Any, ref: ClaimRef, driver: str, pool: str) -> list[Allocated]:
    """This driver's results in ``claim``: refused unless the claim is this one, allocated, in
    use by some pod, and every one of the driver's devices is in this node's pool."""
    metadata = _object(claim, "metadata")
    if metadata.get("uid") != ref.uid:
        raise ClaimProblem(
            f"claim {ref.namespace}/{ref.name} has uid {metadata.get('uid')!r}, not {ref.uid!r}: "
            "it was deleted and created again"
        )
    status = _object(claim, "status")
    allocation = status.get("allocation")
    if not isinstance(allocation, dict):
        raise ClaimProblem(f"claim {ref} is not allocated")
    # The kubelet checks that its pod is a consumer; a claim nobody reserved is not to be
    # prepared by anyone (the scheduler reserves before the pod reaches a node).
    consumers = status.get("reservedFor")
    if not isinstance(consumers, list) or not consumers:
        raise ClaimProblem(f"claim {ref} is reserved for no pod")
    results = _object(allocation, "devices").get("results") or []
    if not isinstance(results, list):
        raise ClaimProblem(f"claim {ref}: status.allocation.devices.results is not a list")
    mine = []
    for result in results:
        if not isinstance(result, dict) or result.get("driver") != driver:
            continue
        request, device = result.get("request"), result.get("device")
        if not isinstance(request, str) or not isinstance(device, str) or not device:
            raise ClaimProblem(f"claim {ref}: an allocation result without request or device: {result}")
        if result.get("pool") != pool:
            raise ClaimProblem(
                f"claim {ref}: device {device!r} is in pool {result.get('pool')!r}, not this node's "
                f"({pool!r})"
            )
        mine.append(
            Allocated(request, device, result.get("adminAccess") is True, _share(ref, device, result))
        )
    if not mine:
        raise ClaimProblem(f"claim {ref} has no device of driver {driver}")
    return mine


def _share(ref: ClaimRef, device: str, result: dict[str, Any]) -> DeviceShare | None:
    """A result's share of its device (consumable capacity), checked: a UID, and at most
    MAX_ATTRIBUTES_AND_CAPACITIES capacities, each a name and a quantity. The device ID is the
    DRA device name until the preparer knows the driver's."""
    share_id = result.get("shareID")
    if share_id is None:
        return None
    if not isinstance(share_id, str) or not _UID.fullmatch(share_id):
        raise ClaimProblem(f"claim {ref}: device {device!r} has shareID {str(share_id)[:80]!r}, not a uid")
    consumed = result.get("consumedCapacity") or {}
    if not isinstance(consumed, dict) or len(consumed) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise ClaimProblem(f"claim {ref}: device {device!r}: consumedCapacity is not a map of capacities")
    for name, amount in consumed.items():
        problem = qualified_name_problem(name) or (
            quantity_problem(amount) if isinstance(amount, str) else "not a quantity"
        )
        if problem is not None:
            raise ClaimProblem(f"claim {ref}: device {device!r}: consumedCapacity: {problem}")
    return DeviceShare(device, share_id, tuple(sorted(consumed.items())))


def _object(parent: Any, key: str) -> dict[str, Any]:
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, dict) else {}

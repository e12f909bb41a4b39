"""ResourceClaims in memory, for the binding-conditions tests (tests/unit/test_dra_binding_stateful.py):
the calls ClaimBinder makes, with resourceVersions, optimistic concurrency and watch events as the
real API server has them, and the scheduler's side (allocate, deallocate, delete) as it writes it.

What the real server checks of a status write, and this one too (k8s.io/kubernetes
pkg/apis/resource/validation, 1.37): every status.devices entry names an allocated device (else
422), and a write holding an older resourceVersion is a conflict (409).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

from shim.dra.kube import ApiError
from tests.support.memory_api import MemoryCollection


class MemoryClaims(MemoryCollection):
    def __init__(self, driver: str) -> None:
        super().__init__()
        self.driver = driver
        self.claims = self.objects  # by name, in namespace "default"
        self.refused: list[str] = []  # the 422s: writes of devices not allocated

    # --- the scheduler's side (and a user's) ----------------------------------------------------

    def allocate(self, name: str, pool: str, device: str, binding: dict[str, Any] | None) -> None:
        """The claim ``name`` (made if new) allocated ``device`` of ``pool``, its status.devices
        cleared, as the scheduler leaves a fresh allocation; ``binding``: what the result copies."""
        claim = self.claims.get(name) or {
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"}
        }
        claim = copy.deepcopy(claim)
        result = {"request": "gpu", "driver": self.driver, "pool": pool, "device": device, **(binding or {})}
        claim["status"] = {
            "allocation": {"devices": {"results": [result]}, "allocationTimestamp": f"t{self.version + 1}"}
        }
        self._store("MODIFIED" if name in self.claims else "ADDED", claim)

    def deallocate(self, name: str) -> None:
        """The scheduler frees the claim (a binding failure or timeout): allocation and status.devices go."""
        if name in self.claims:
            claim = copy.deepcopy(self.claims[name])
            claim["status"] = {}
            self._store("MODIFIED", claim)

    def delete(self, name: str) -> None:
        if name in self.claims:
            self._store("DELETED", copy.deepcopy(self.claims[name]))

    # --- the calls ClaimBinder makes --------------------------------------------------------------

    async def served_versions(self, resource: str) -> list[str]:
        return ["v1"]

    async def list_claims(self, version: str) -> tuple[list[dict[str, Any]], str]:
        return copy.deepcopy(list(self.claims.values())), str(self.version)

    async def get_claim(self, version: str, namespace: str, name: str) -> dict[str, Any]:
        if name not in self.claims:
            raise ApiError(f"GET {name}: 404 not found", 404)
        return copy.deepcopy(self.claims[name])

    async def replace_claim_status(self, version: str, claim: dict[str, Any]) -> dict[str, Any]:
        name = claim["metadata"]["name"]
        old = self.claims.get(name)
        if old is None:
            raise ApiError(f"PUT {name}/status: 404 not found", 404)
        if old["metadata"]["resourceVersion"] != claim["metadata"]["resourceVersion"]:
            raise ApiError(f"PUT {name}/status: 409 conflict", 409)
        allocated = {
            (r["driver"], r["pool"], r["device"], r.get("shareID"))
            for r in old.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        }
        for entry in claim.get("status", {}).get("devices") or ():
            if (entry["driver"], entry["pool"], entry["device"], entry.get("shareID")) not in allocated:
                self.refused.append(name)
                raise ApiError(f"PUT {name}/status: 422 must be an allocated device in the claim", 422)
        obj = copy.deepcopy(old)
        obj["status"] = copy.deepcopy(claim["status"])
        return self._store("MODIFIED", obj)

    def watch_claims(self, version: str, since: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return self._watch(since)

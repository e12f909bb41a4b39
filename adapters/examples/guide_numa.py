"""Preferred allocation: accelerators chosen to share a NUMA node (docs/sdk.md).

acc0 and acc1 sit on NUMA node 0, acc2 to acc4 on node 1. Asked for ``size`` devices, the driver
keeps the ones the kubelet must include, then takes devices on their nodes, then on the node with
the most devices available, so a container's devices share a node wherever they can.
"""

from __future__ import annotations

from collections import Counter

from shim.sdk import Driver, run, types

RESOURCE = "example.com/acc"
NODES = {"acc0": 0, "acc1": 0, "acc2": 1, "acc3": 1, "acc4": 1}


class Accelerators(Driver):
    name = "accelerators"

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=RESOURCE, preferred_allocation=True)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=acc, health=types.Health.HEALTHY, numa_nodes=[n]) for acc, n in NODES.items()]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant(envs={"ACCELERATORS": ",".join(ids)}) for ids in containers]

    async def preferred_allocation(self, resource: str, request: types.PreferenceRequest) -> list[str]:
        chosen = list(request.must_include)
        rest = [acc for acc in request.available if acc not in chosen]
        home = {NODES[acc] for acc in chosen}
        free = Counter(NODES[acc] for acc in rest)
        # The must-include devices' nodes first, then the fullest node; by name within a node.
        rest.sort(key=lambda acc: (NODES[acc] not in home, -free[NODES[acc]], acc))
        return chosen + rest[: request.size - len(chosen)]


if __name__ == "__main__":
    run(Accelerators())

"""Declared grants beside per-call allocate, in one driver (docs/sdk.md).

Each disk declares its grant in the device list: devshim answers the kubelet's Allocate for
disks itself, merging the grants of the disks asked for, and never calls the driver. A virtual
function's grant is made per call instead: each container gets a VLAN of its own, as a NIC
driver would program one when asked.
"""

from __future__ import annotations

from shim.sdk import Driver, run, types

DISK = "example.com/disk"
VF = "example.com/vf"


class Storage(Driver):
    name = "storage"

    def __init__(self) -> None:
        self.next_vlan = 100

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=DISK), types.Resource(name=VF)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        if resource == DISK:
            return [
                types.Device(
                    id=disk,
                    health=types.Health.HEALTHY,
                    grant=types.Grant(envs={"DISKS": disk}, cdi_devices=[f"example.com/disk={disk}"]),
                )
                for disk in ("disk0", "disk1")
            ]
        return [types.Device(id=f"vf{i}", health=types.Health.HEALTHY) for i in range(4)]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        # Only virtual functions get here: every disk declares its grant.
        grants = []
        for ids in containers:
            grants.append(types.Grant(envs={"VFS": ",".join(ids), "VLAN": str(self.next_vlan)}))
            self.next_vlan += 1
        return grants


if __name__ == "__main__":
    run(Storage())

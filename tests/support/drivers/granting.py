"""A driver that grants things its operator may not have declared, device by device.

Its per-call resource is example.com/granting, or $GRANTING_RESOURCE where that is set (a driver
serving a resource of another vendor's domain). It answers ``allocate`` per call: ``ok-N`` gets
/dev/null and GRANTING=<id>, ``escape`` a device node at $ESCAPE_PATH (a symlink out of an
allowed glob), ``mount`` a writable mount of /etc (the floor's), ``preload`` LD_PRELOAD, ``dev``
/dev itself as a node, ``shm`` a node at $SHM_LINK (a link in world-writable /dev/shm), ``cdi``
its own vendor's CDI device and then another vendor's, ``cdi-own`` the CDI device of its
resource's own kind (``<resource>=0``), ``cdi-all`` every GPU of nvidia.com
(``nvidia.com/gpu=all``), ``shell`` SHELLOPTS=xtrace with a PS4 that runs a command (what bash
does on start with both), ``pts`` a node at $PTS_PATH (default /dev/pts/0: a terminal of the
host). It declares ``deallocate`` and appends each call's IDs as one line to $DEALLOCATED.
example.com/granting-declared declares its grants at list time: ``d-ok`` /dev/null, ``d-escape``
/dev/../etc/shadow.
"""

from __future__ import annotations

import os
from pathlib import Path

from shim.sdk import Driver, run, types

PER_CALL = "example.com/granting"
DECLARED = "example.com/granting-declared"
PER_CALL_IDS = (
    "ok-0", "ok-1", "escape", "mount", "preload", "dev", "shm", "cdi", "cdi-own", "cdi-all", "shell", "pts",
)  # fmt: skip
# What ``shell`` sets: bash traces its start (xtrace) and expands PS4 before each traced line.
SHELL_ENVS = {"SHELLOPTS": "xtrace", "PS4": "$(id >&2)"}


def per_call_resource() -> str:
    return os.environ.get("GRANTING_RESOURCE", PER_CALL)


def null_node(device_id: str) -> types.DeviceNode:
    return types.DeviceNode(container_path=f"/dev/{device_id}", host_path="/dev/null", permissions="rw")


def grant_for(device_id: str) -> types.Grant:
    if device_id == "escape":
        node = types.DeviceNode(
            container_path="/dev/x", host_path=os.environ["ESCAPE_PATH"], permissions="rw"
        )
        return types.Grant(device_nodes=[node])
    if device_id == "mount":
        return types.Grant(
            mounts=[types.Mount(container_path="/host-etc", host_path="/etc", read_only=False)]
        )
    if device_id == "preload":
        return types.Grant(envs={"LD_PRELOAD": "/tmp/evil.so"})
    if device_id in ("dev", "shm", "pts"):
        host_path = {
            "dev": "/dev",
            "shm": os.environ.get("SHM_LINK", ""),
            "pts": os.environ.get("PTS_PATH", "/dev/pts/0"),
        }[device_id]
        return types.Grant(device_nodes=[types.DeviceNode(container_path="/dev/x", host_path=host_path)])
    if device_id == "cdi":
        return types.Grant(cdi_devices=["example.com/granting=0", "nvidia.com/gpu=all"])
    if device_id == "cdi-own":
        return types.Grant(cdi_devices=[f"{per_call_resource()}=0"])
    if device_id == "cdi-all":
        return types.Grant(cdi_devices=["nvidia.com/gpu=all"])
    if device_id == "shell":
        return types.Grant(envs=dict(SHELL_ENVS))
    return types.Grant(envs={"GRANTING": device_id}, device_nodes=[null_node(device_id)])


class Granting(Driver):
    name = "granting"

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=per_call_resource(), deallocate=True), types.Resource(name=DECLARED)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        if resource == DECLARED:
            escape = types.DeviceNode(
                container_path="/dev/x", host_path="/dev/../etc/shadow", permissions="r"
            )
            return [
                types.Device(
                    id="d-ok", health=types.Health.HEALTHY, grant=types.Grant(device_nodes=[null_node("d")])
                ),
                types.Device(
                    id="d-escape", health=types.Health.HEALTHY, grant=types.Grant(device_nodes=[escape])
                ),
            ]
        return [types.Device(id=i, health=types.Health.HEALTHY) for i in PER_CALL_IDS]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        grants = []
        for ids in containers:
            grant = types.Grant()
            for device_id in ids:
                part = grant_for(device_id)
                grant.envs.update(part.envs)
                grant.mounts.extend(part.mounts)
                grant.device_nodes.extend(part.device_nodes)
                grant.cdi_devices.extend(part.cdi_devices)
            grants.append(grant)
        return grants

    async def deallocate(self, resource: str, device_ids: list[str]) -> None:
        with Path(os.environ["DEALLOCATED"]).open("a") as record:
            record.write(",".join(device_ids) + "\n")


if __name__ == "__main__":
    run(Granting())

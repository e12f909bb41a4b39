"""Which of devshim's files (rooms) one request runs through: measured, not read.

Runs devshim in this process (a sim driver as its subprocess, the fake kubelet as its kubelet),
then traces Python calls while one request travels: an Allocate to the driver and back (the
kubelet's call until its answer), and a driver's list to ListAndWatch (the sim told to flip a
device's health until the kubelet's stream shows it); and a NodePrepareResources to its CDI file
(the kubelet's DRA call on devshim's DRAPlugin v1 servicer, with a static resource in a DRA
pool and the claim as the API server would return it). A room is a file under src/shim/ whose
code ran, generated stubs and the fake kubelet (the kubelet's side) left out. Background work
that happens to run meanwhile would count too: the script waits for a quiet devshim first.

    python -m scripts.walk_rooms            # prints each walk's rooms, in first-visit order
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

from loguru import logger

import shim
from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.model import Health
from shim.settings import Settings

SRC = Path(shim.__file__).parent
LEFT_OUT = ("generated", "compat")
GPU = "example.com/walk"


def _room(filename: str) -> str | None:
    path = Path(filename)
    if not path.is_relative_to(SRC):
        return None
    room = path.relative_to(SRC)
    return None if room.parts[0] in LEFT_OUT else str(room)


async def traced(step: Callable[[], Awaitable[Any]]) -> list[str]:
    """The rooms whose code ran while ``step`` did, in first-visit order."""
    rooms: dict[str, None] = {}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and (room := _room(frame.f_code.co_filename)) is not None:
            rooms.setdefault(room)

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        await step()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return list(rooms)


async def prepare_walk(root: Path) -> list[str]:
    """NodePrepareResources until its answer, the CDI spec written."""
    from shim.cdi import SpecDir
    from shim.core.resource import ResourceService
    from shim.dra.checkpoint import Checkpoint
    from shim.dra.claims import ClaimRef
    from shim.dra.health import PoolHealth
    from shim.dra.ownership import PoolOwners
    from shim.dra.plugin import v1
    from shim.dra.plugin.common import DraService, PluginStatus
    from shim.dra.preparer import ClaimPreparer
    from shim.generated.dra.v1 import api_pb2 as pb
    from shim.grants import GrantSettings
    from shim.model import Device
    from shim.policy import GrantPolicy, GrantPolicySettings
    from shim.sources import StaticSource

    driver, pool = "gpu.example.com", "node-1"
    grant = GrantSettings(envs={"WALK": "{ids}"})
    source = StaticSource([Device(f"gpu-{n}") for n in range(4)], grant)
    service = ResourceService(GPU, source, policy=GrantPolicy(GPU, GrantPolicySettings(envs=["WALK"])))
    await service.start()
    await service.serve_dra({}, ())
    services = lambda: {GPU: service}  # noqa: E731
    owners = PoolOwners((GPU,), services, lambda resource: ())
    claim = {
        "metadata": {"uid": "u-1", "name": "c", "namespace": "default"},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "r", "driver": driver, "pool": pool, "device": "gpu-0"},
            ]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
        },
    }  # fmt: skip

    async def read_claim(ref: ClaimRef) -> dict[str, Any]:
        return claim

    specs, state = root / "cdi", root / "state"
    specs.mkdir()
    preparer = ClaimPreparer(
        driver, pool, owners, services, read_claim, SpecDir(specs), Checkpoint(state, driver)
    )
    status = PluginStatus(driver, "dra.sock", "reg.sock")
    servicer = v1.Servicer(DraService(preparer, PoolHealth(owners, services), status))
    request = pb.NodePrepareResourcesRequest(claims=[pb.Claim(namespace="default", name="c", uid="u-1")])
    owners()  # the publisher has decided who owns each name before any claim arrives
    answers: list[Any] = []

    async def prepare() -> None:
        context: Any = None  # the servicer does not touch its context
        answers.append(await servicer.NodePrepareResources(request, context))

    rooms = await traced(prepare)
    assert list(specs.iterdir()), f"no CDI spec was written: {answers}"
    await service.stop()
    return rooms


async def main() -> None:
    logger.remove()
    with tempfile.TemporaryDirectory(prefix="walk-") as folder:
        root = Path(folder)
        control = root / "sim.ctl"
        control.touch()
        config = {"resources": [{"name": GPU, "count": 4}], "control_file": str(control)}
        command = [sys.executable, "-m", "devshim_adapters.sim", "--config-json", json.dumps(config)]
        settings = Settings.load(
            device_plugins_dir=root / "dp",
            state_dir=root / "state",
            deallocation={"pod_resources_socket": str(root / "pr.sock")},
            # As the tests run drivers: as root, so a checkout under /root is readable.
            drivers=[{"name": "sim", "command": command, "resources": [GPU], "policy": {}, "user": "root"}],
        )
        async with FakeKubelet(root / "dp") as kubelet, Shim(settings):
            session = await kubelet.wait_for_plugin(GPU, timeout=30)
            await session.wait_for_list(lambda devices: len(devices) == 4, timeout=30)
            await asyncio.sleep(1)  # let start-up work (inventory saves, first lists) settle
            allocate = await traced(lambda: session.admit(1))
            first = sorted(d.id for d in (await session.wait_for_list()))[0]

            async def flip() -> None:
                with control.open("a") as commands:
                    commands.write(f"health {GPU} {first} Unhealthy\n")
                await session.wait_for_list(
                    lambda devices: any(d.id == first and d.health == Health.UNHEALTHY for d in devices),
                    timeout=30,
                )

            listed = await traced(flip)
        prepared = await prepare_walk(root)
    for name, rooms in (
        ("Allocate to the driver and back", allocate),
        ("a driver's list to ListAndWatch", listed),
        ("NodePrepareResources to its CDI file", prepared),
    ):
        print(f"{name}: {len(rooms)} rooms")
        for room in rooms:
            print(f"  {room}")


if __name__ == "__main__":
    asyncio.run(main())

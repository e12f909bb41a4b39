"""A benchmark driver on the Python SDK: GPU-like devices; SIGUSR1 flips one device's health.

Devices are named GPU-<uuid> (deterministic), one NUMA node each (i % 4). Every
SIGUSR1 toggles the health of the first device of the first resource and sends
health_changed; the CLOCK_MONOTONIC time taken just before the notification is
appended to the --stamps file (after sending), so a benchmark can time devshim
from the driver's send, not from a poll. Allocate answers an empty grant.
Run by devshim: python bench/driver.py --stamps FILE --resource NAME=COUNT ...
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
import uuid
from pathlib import Path

from shim.sdk import Driver, run, types

NUMA_NODES = 4


def device_ids(count: int, seed: int = 0) -> list[str]:
    """``count`` realistic, deterministic GPU IDs: "GPU-" and a UUID (40 characters)."""
    return [
        f"GPU-{uuid.UUID(int=(seed << 64) + i * 0x9E3779B97F4A7C15 + 1, version=4)}" for i in range(count)
    ]


class BenchDriver(Driver):
    name = "devshim-bench"

    def __init__(self, resources: dict[str, int], stamps: Path) -> None:
        # resource -> device ID -> its NUMA node
        self._devices = {
            name: {i: n % NUMA_NODES for n, i in enumerate(device_ids(count, seed))}
            for seed, (name, count) in enumerate(resources.items())
        }
        self._unhealthy: set[str] = set()
        self._stamps = stamps

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=name) for name in self._devices]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [
            types.Device(id=i, health=_health(i not in self._unhealthy), numa_nodes=[node])
            for i, node in self._devices[resource].items()
        ]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant() for _ in containers]

    async def on_initialize(self, params: types.InitializeParams) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self._on_signal)

    def _on_signal(self) -> None:
        asyncio.get_running_loop().create_task(self.flip())

    async def flip(self) -> None:
        resource, devices = next(iter(self._devices.items()))
        device_id = next(iter(devices))
        self._unhealthy ^= {device_id}
        stamp = time.monotonic()
        await self.health_changed(resource, [(device_id, _health(device_id not in self._unhealthy))])
        with self._stamps.open("a") as f:
            f.write(f"{stamp!r}\n")


def _health(healthy: bool) -> types.Health:
    return types.Health.HEALTHY if healthy else types.Health.UNHEALTHY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stamps", type=Path, required=True)
    parser.add_argument("--resource", action="append", default=[], help="NAME=COUNT")
    args = parser.parse_args()
    resources = {name: int(count) for name, _, count in (r.partition("=") for r in args.resource)}
    run(BenchDriver(resources, args.stamps), log_level="WARNING")


if __name__ == "__main__":
    main()

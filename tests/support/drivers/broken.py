"""A driver with one deliberate bug, chosen on the command line, for testing `devshim compat`.

    python broken.py BUG [--state-dir DIR]

Serves example.com/broken, devices b-0..b-3, declaring every optional method; no device declares
its grant, so every Allocate reaches the driver. SIGUSR1 flips b-3's health (the device
`devshim compat`'s health_change row picks). One resource only: with several, the driver_crash
row races (see tests/compat/test_compat_command.py). So a bug also fails the rows whose pods go
through the broken call: the fake kubelet's run_pod allocates and calls PreStartContainer, its
end_pod calls PostStopContainer and then Deallocate, raising the first error.

Bugs (BUGS): each raises a DriverError from one method, except forgets-after-restart, which lists
b-3 no more once restarted after a crash. It knows it was: every run leaves a marker in
--state-dir (one per devshim process) that only a clean shutdown removes, so a run that finds
one follows a run that was killed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

from shim.sdk import Driver, DriverError, ErrorCode, run, types

RESOURCE = "example.com/broken"
IDS = [f"b-{i}" for i in range(4)]
BUGS = ("allocate-fails", "prestart-fails", "deallocate-fails", "post-stop-fails", "forgets-after-restart")


def broken(method: str) -> DriverError:
    return DriverError(ErrorCode.INTERNAL_ERROR, f"broken driver: {method} fails on purpose")


class Broken(Driver):
    name = "broken"

    def __init__(self, bug: str, marker: Path | None) -> None:
        self.bug = bug
        self.marker = marker
        self.devices = list(IDS)
        self.health = dict.fromkeys(IDS, types.Health.HEALTHY)

    def resources(self) -> list[types.Resource]:
        return [
            types.Resource(
                name=RESOURCE, preferred_allocation=True, prestart=True, deallocate=True, post_stop=True
            )
        ]

    async def on_initialize(self, params: types.InitializeParams) -> None:
        if self.marker is not None:
            if self.marker.exists():  # the run before this one never shut down: it crashed
                self.devices.pop()
            self.marker.touch()
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGUSR1, lambda: asyncio.create_task(self._flip())
        )

    async def on_shutdown(self) -> None:
        if self.marker is not None:
            self.marker.unlink(missing_ok=True)

    async def _flip(self) -> None:
        last = self.devices[-1]
        healthy = self.health[last] == types.Health.HEALTHY
        self.health[last] = types.Health.UNHEALTHY if healthy else types.Health.HEALTHY
        await self.health_changed(RESOURCE, [(last, self.health[last])])

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id=i, health=self.health[i]) for i in self.devices]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        if self.bug == "allocate-fails":
            raise broken("allocate")
        return [types.Grant(envs={"BROKEN": ",".join(ids)}) for ids in containers]

    async def preferred_allocation(self, resource: str, request: types.PreferenceRequest) -> list[str]:
        rest = [i for i in request.available if i not in request.must_include]
        return [*request.must_include, *rest][: request.size]

    async def prestart(self, resource: str, device_ids: list[str]) -> None:
        if self.bug == "prestart-fails":
            raise broken("prestart")

    async def deallocate(self, resource: str, device_ids: list[str]) -> None:
        if self.bug == "deallocate-fails":
            raise broken("deallocate")

    async def post_stop(self, resource: str, device_ids: list[str]) -> None:
        if self.bug == "post-stop-fails":
            raise broken("post_stop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("bug", choices=BUGS)
    parser.add_argument("--state-dir", type=Path, help="where forgets-after-restart keeps its marker")
    args = parser.parse_args()
    marker = None
    if args.bug == "forgets-after-restart":
        if args.state_dir is None:
            parser.error("forgets-after-restart needs --state-dir")
        # One marker per devshim (our parent), so two devshims sharing the directory do not mix.
        marker = args.state_dir / f"broken-{os.getppid()}.running"
    run(Broken(args.bug, marker))


if __name__ == "__main__":
    main()

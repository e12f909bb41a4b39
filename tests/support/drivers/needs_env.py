"""A driver that needs its vendor's environment, as many do: without $VENDOR_HOME it exits at
once, saying so; with it, example.com/vendor's one device is granted VENDOR_HOME. devshim gives a
driver exactly its configured `env`, so it works only where the config names VENDOR_HOME."""

from __future__ import annotations

import os
import sys

from shim.sdk import Driver, run, types

RESOURCE = "example.com/vendor"


class NeedsEnv(Driver):
    name = "needs-env"

    def __init__(self, home: str) -> None:
        self.home = home

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=RESOURCE)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id="v-0", health=types.Health.HEALTHY)]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant(envs={"VENDOR_HOME": self.home}) for _ in containers]


if __name__ == "__main__":
    home = os.environ.get("VENDOR_HOME")
    if home is None:
        sys.exit("needs-env: VENDOR_HOME is not set")
    run(NeedsEnv(home))

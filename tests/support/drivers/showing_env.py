"""A driver that shows the environment it was started with: example.com/env's one device grants
each variable as SEEN_<NAME>, so a test sees exactly what devshim passed it (read from
/proc/self/environ: Python and the SDK add variables of their own to os.environ)."""

from __future__ import annotations

from pathlib import Path

from shim.sdk import Driver, run, types

RESOURCE = "example.com/env"
GIVEN = dict(v.split("=", 1) for v in Path("/proc/self/environ").read_text().split("\0") if v)


class ShowingEnv(Driver):
    name = "showing-env"

    def resources(self) -> list[types.Resource]:
        return [types.Resource(name=RESOURCE)]

    async def list_devices(self, resource: str) -> list[types.Device]:
        return [types.Device(id="env-0", health=types.Health.HEALTHY)]

    async def allocate(self, resource: str, containers: list[list[str]]) -> list[types.Grant]:
        return [types.Grant(envs={f"SEEN_{k}": v for k, v in GIVEN.items()}) for _ in containers]


if __name__ == "__main__":
    run(ShowingEnv())

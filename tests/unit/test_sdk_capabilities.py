"""What the SDK warns about at initialize: optional methods and capability flags that disagree."""

from __future__ import annotations

import pytest

from shim.sdk import Driver, types
from shim.sdk.server import capability_mismatches


class Plain(Driver):
    def resources(self) -> list[types.Resource]:
        return []

    async def list_devices(self, resource: str) -> list[types.Device]:
        return []


class Prestarting(Plain):
    async def prestart(self, resource: str, device_ids: list[str]) -> None:
        pass


A, B = "example.com/a", "example.com/b"


@pytest.mark.parametrize(
    ("driver", "resources", "problems"),
    [
        (Plain(), [types.Resource(name=A)], []),
        (Prestarting(), [types.Resource(name=A), types.Resource(name=B, prestart=True)], []),
        (
            Prestarting(),
            [types.Resource(name=A), types.Resource(name=B)],
            [
                "Prestarting overrides prestart but no resource in resources() sets prestart=True: "
                "devshim will never call it"
            ],
        ),
        (
            Plain(),
            [types.Resource(name=A, deallocate=True), types.Resource(name=B, deallocate=True)],
            [
                f"{A} declares deallocate but the driver does not implement it",
                f"{B} declares deallocate but the driver does not implement it",
            ],
        ),
        (Prestarting(), [], []),
    ],
    ids=[
        "neither",
        "one-resource-declares-it",
        "override-without-flag",
        "flag-without-override",
        "no-resources-yet",
    ],
)
def test_capability_mismatches(driver: Driver, resources: list[types.Resource], problems: list[str]) -> None:
    """An override is fine when any resource sets its flag; a driver serving nothing yet (it
    finds its resources later) is not judged."""
    assert capability_mismatches(driver, resources) == problems

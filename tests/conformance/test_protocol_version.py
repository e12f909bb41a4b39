"""devshim refuses a driver whose initialize answers a protocol_version that is no semantic version
(issue 45), and says why: the driver's value, the rule, and the version devshim speaks. A real
driver subprocess (drivers/versioned.py) answers what no SDK would send."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.driverprotocol import PROTOCOL_VERSION
from shim.settings import Settings
from tests.conformance.builds import ROOT

DRIVER = ROOT / "tests" / "conformance" / "drivers" / "versioned.py"
RESOURCE = "example.com/versioned"
WAIT_S = 20.0  # a busy 2-core machine; a refusal takes well under a second


def settings(plugin_dir: Path, state_dir: Path, version: object) -> Settings:
    return Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        drivers=[{
            "name": "versioned", "user": "root",
            "command": [sys.executable, str(DRIVER), json.dumps(version)],
            "resources": [RESOURCE],
            "restart": {"max_start_failures": 2, "backoff_initial_s": 0.01, "backoff_max_s": 0.05},
        }],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ("1.x", "the driver's protocol version '1.x' is not a semantic version"),
        ("v1.3.0", "the driver's protocol version 'v1.3.0' is not a semantic version"),
        (1.3, "the driver's protocol version 1.3 is not a semantic version"),  # a JSON number
    ],
)
async def test_a_non_semver_protocol_version_is_refused_and_the_error_says_why(
    plugin_dir: Path, state_dir: Path, version: object, said: str
) -> None:
    """The driver starts and answers initialize, devshim refuses it before serving anything of
    it: its status says the value, that it is no semantic version, and devshim's own version."""
    async with Shim(settings(plugin_dir, state_dir, version)) as shim:
        host = shim.drivers[0]
        async with asyncio.timeout(WAIT_S):
            await host.gave_up.wait()
        shown = shim.status()["drivers"]["versioned"]
        assert said in shown["last_failure"], shown
        assert f"devshim speaks {PROTOCOL_VERSION} (majors must match)" in shown["last_failure"], shown
        assert RESOURCE not in shim.served


async def test_the_same_driver_answering_a_semantic_version_of_our_major_is_served(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """The control: an older minor of the same major (1.0.0) is no refusal; the resource registers."""
    async with Shim(settings(plugin_dir, state_dir, "1.0.0")):
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=WAIT_S)
        await session.wait_for_list(lambda devices: [d.id for d in devices] == ["v-0"], timeout=WAIT_S)

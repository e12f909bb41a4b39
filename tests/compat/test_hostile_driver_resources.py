"""A hostile driver declaring resources that are not its own, or names that are not resource
names, seen from the fake kubelet (issue 19, items 1 and 6).

devshim runs in-process with a static resource and real driver subprocesses
(tests/support/drivers/claiming.py, which declares whatever it is told to, at ``initialize`` and
in ``resources_changed`` messages sent one per SIGUSR1). Each message carries a marker resource
of the driver's own, so the kubelet registering the marker shows the whole message was applied.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.driverhost import DriverHost
from shim.ops.series import REGISTRY
from shim.settings import Settings
from tests.support import DRIVERS
from tests.support.waiting import until

CLAIMING = DRIVERS / "claiming.py"
STATIC = "example.com/static"
SHARED = "example.com/shared"
THIEF = "example.com/thief"
MARKS = [f"example.com/mark-{n}" for n in range(4)]
WAIT_S = 20.0


def claiming(
    name: str, declared: list[str], steps: Sequence[list[str]] = (), *, resources: list[str], **extra: Any
) -> dict[str, Any]:
    """Settings of a claiming.py driver named ``name`` with device IDs ``<name>-0``, ``<name>-1``,
    that may serve ``resources`` (whatever it declares) and grant its env CLAIMED."""
    env = {
        "CLAIM_RESOURCES": json.dumps(declared),
        "CLAIM_STEPS": json.dumps(list(steps)),
        "CLAIM_PREFIX": f"{name}-",
    }
    command = [sys.executable, str(CLAIMING)]
    return {
        "name": name,
        "user": "root",
        "command": command,
        "env": env,
        "resources": resources,
        "policy": {"envs": ["CLAIMED"]},
        **extra,
    }


@asynccontextmanager
async def devshim(
    plugin_dir: Path, state_dir: Path, drivers: list[dict[str, Any]], static: str = STATIC
) -> AsyncIterator[tuple[FakeKubelet, Shim]]:
    """devshim serving ``static`` (one device, dev0) and ``drivers``, with the fake kubelet."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        resources=[{"name": static, "static": {"count": 1, "grant": {"envs": {"STATIC": "{ids}"}}}}],
        drivers=drivers,
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings) as shim:
        yield kubelet, shim


def host(shim: Shim, name: str) -> DriverHost:
    return next(d for d in shim.drivers if d.name == name)


def send_step(shim: Shim, driver: str) -> None:
    """The driver sends its next resources_changed."""
    process = host(shim, driver).process
    assert process is not None
    os.kill(process.pid, signal.SIGUSR1)


async def next_step(kubelet: FakeKubelet, shim: Shim, driver: str, marker: str) -> None:
    """The driver sends its next resources_changed; wait until its ``marker`` resource registers
    (the host applies a driver's messages in order, so the whole message has been applied)."""
    send_step(shim, driver)
    await kubelet.wait_for_plugin(marker, timeout=WAIT_S)


def refused(driver: str, resource: str) -> float:
    labels = {"driver": driver, "resource": resource}
    return REGISTRY.get_sample_value("devshim_driver_refused_claims_total", labels) or 0.0


def registration_attempts(kubelet: FakeKubelet, resource: str) -> int:
    return sum(r.resource_name == resource for r in kubelet.registrations)


async def ids_listed(session: PluginSession, ids: list[str]) -> None:
    await session.wait_for_list(lambda devices: [d.id for d in devices] == ids, timeout=WAIT_S)


# --- item 1: a resource belongs to the source that configured or first claimed it ------------


@pytest.mark.parametrize("victim", ["static", "driver"])
async def test_a_driver_can_neither_take_over_nor_remove_another_sources_resource(
    plugin_dir: Path, state_dir: Path, warnings: list[str], victim: str
) -> None:
    """The thief declares the victim's resource, drops it, declares it again. Each claim is
    refused (a warning naming both parties, the metric counts it), the drop removes nothing, and
    the kubelet's one registration of the resource keeps streaming the owner's devices."""
    target, owner_ids, grant, owner_words = {
        "static": (STATIC, ["dev0"], {"STATIC": "dev0"}, "static config"),
        "driver": (SHARED, ["owner-0", "owner-1"], {"CLAIMED": "owner-0"}, "driver 'owner'"),
    }[victim]
    steps = [[THIEF, target, MARKS[1]], [THIEF, MARKS[2]], [THIEF, target, MARKS[3]]]
    drivers = [claiming("thief", [THIEF], steps, resources=[THIEF, *MARKS[1:]])]
    if victim == "driver":
        drivers.insert(0, claiming("owner", [SHARED], resources=[SHARED]))
    before = refused("thief", target)
    async with devshim(plugin_dir, state_dir, drivers) as (kubelet, shim):
        session = await kubelet.wait_for_plugin(target, timeout=WAIT_S)
        await ids_listed(session, owner_ids)
        await kubelet.wait_for_plugin(THIEF, timeout=WAIT_S)

        await next_step(kubelet, shim, "thief", MARKS[1])
        assert refused("thief", target) == before + 1
        claim = [w for w in warnings if "driver 'thief'" in w and target in w]
        assert claim and owner_words in claim[0], warnings

        await next_step(kubelet, shim, "thief", MARKS[2])  # drops the target: must remove nothing
        await next_step(kubelet, shim, "thief", MARKS[3])  # claims it again
        assert refused("thief", target) == before + 2

        assert kubelet.plugin(target) is session and not session.stream_ended.is_set(), session
        assert registration_attempts(kubelet, target) == 1
        assert all([d.id for d in devices] == owner_ids for devices in session.lists), session.lists
        assert (await session.allocate(owner_ids[:1])).envs == grant
        assert sorted(host(shim, "thief").sources) == sorted([THIEF, MARKS[3]])
        assert shim.status()["drivers"]["thief"]["resources"] == sorted([THIEF, MARKS[3]])
    # Nothing of the refused resource was saved as the thief's.
    assert not list((state_dir / "drivers" / "thief").glob("*shared*"))
    assert not list((state_dir / "drivers" / "thief").glob("*static*"))


async def test_a_resource_a_driver_served_before_the_config_made_it_static_is_not_restored_for_it(
    plugin_dir: Path, state_dir: Path, warnings: list[str]
) -> None:
    """The driver's saved inventory names a resource that is static now: devshim does not serve
    it for the driver again, so the driver's next set (without it) removes nothing."""
    async with devshim(plugin_dir, state_dir, [claiming("thief", [SHARED], resources=[SHARED])]) as (
        kubelet,
        shim,
    ):
        await ids_listed(await kubelet.wait_for_plugin(SHARED, timeout=WAIT_S), ["thief-0", "thief-1"])

    before = refused("thief", SHARED)
    thief = claiming("thief", [THIEF], resources=[THIEF])  # the config no longer gives it SHARED
    async with devshim(plugin_dir, state_dir, [thief], static=SHARED) as (kubelet, shim):
        session = await kubelet.wait_for_plugin(SHARED, timeout=WAIT_S)
        await kubelet.wait_for_plugin(THIEF, timeout=WAIT_S)
        assert refused("thief", SHARED) == before + 1
        assert any("not restoring" in w and "driver 'thief'" in w and SHARED in w for w in warnings), warnings
        assert sorted(host(shim, "thief").sources) == [THIEF]
        assert SHARED in shim.served and not session.stream_ended.is_set(), session
        assert all([d.id for d in devices] == ["dev0"] for devices in session.lists), session.lists


async def test_a_driver_given_a_resources_list_serves_only_those_and_they_are_reserved_for_it(
    plugin_dir: Path, state_dir: Path, warnings: list[str]
) -> None:
    """``drivers[].resources``: a name outside the list is refused, at initialize and later; a
    name in it is reserved for that driver before it declares it, so another driver declaring it
    first is refused too."""
    other = "example.com/unlisted"
    listed = claiming("listed", [SHARED, other], [[SHARED, other, MARKS[1]]], resources=[SHARED, MARKS[1]])
    # The thief declares the listed driver's marker before the listed driver does.
    drivers = [listed, claiming("thief", [MARKS[1], THIEF], resources=[THIEF])]
    before_other, before_thief = refused("listed", "other"), refused("thief", MARKS[1])
    async with devshim(plugin_dir, state_dir, drivers) as (kubelet, shim):
        await kubelet.wait_for_plugin(SHARED, timeout=WAIT_S)
        await kubelet.wait_for_plugin(THIEF, timeout=WAIT_S)
        assert refused("thief", MARKS[1]) == before_thief + 1
        assert any("driver 'thief'" in w and MARKS[1] in w and "driver 'listed'" in w for w in warnings), (
            warnings
        )

        await next_step(kubelet, shim, "listed", MARKS[1])
        await ids_listed(kubelet.plugin(MARKS[1]), ["listed-0", "listed-1"])
        assert refused("listed", "other") == before_other + 2
        assert any("driver 'listed'" in w and other in w and "resources" in w for w in warnings), warnings
        assert registration_attempts(kubelet, other) == 0
        assert other not in shim.served
        assert sorted(host(shim, "listed").sources) == sorted([SHARED, MARKS[1]])


# --- item 6: resource names from drivers are validated like config names ----------------------

BAD_NAMES = [
    "kubernetes.io/x",
    "../../../tmp/x",
    "a\nb",
    "example.com/*",
    "example.com/ab\n",
    "example.com/[a]",
]
GOOD, GOOD2 = "example.com/good", "example.com/good2"


async def test_invalid_resource_names_from_a_driver_are_refused_and_its_valid_ones_served(
    plugin_dir: Path, state_dir: Path, warnings: list[str]
) -> None:
    """Invalid names, at initialize and in resources_changed, are refused one by one with a
    warning naming the driver and the name: no socket, no Register, no state file, no handover
    glob; the message's valid names still apply, and dropping names later works."""
    drivers = [
        claiming("namer", [*BAD_NAMES, GOOD], [[*BAD_NAMES, GOOD, GOOD2], [GOOD]], resources=[GOOD, GOOD2])
    ]
    before = refused("namer", "invalid")
    async with devshim(plugin_dir, state_dir, drivers) as (kubelet, shim):
        static = await kubelet.wait_for_plugin(STATIC, timeout=WAIT_S)
        await ids_listed(await kubelet.wait_for_plugin(GOOD, timeout=WAIT_S), ["namer-0", "namer-1"])
        await next_step(kubelet, shim, "namer", GOOD2)
        await ids_listed(kubelet.plugin(GOOD2), ["namer-0", "namer-1"])

        send_step(shim, "namer")  # drops good2
        async with asyncio.timeout(WAIT_S):
            await kubelet.plugin(GOOD2).stream_ended.wait()
        await kubelet.wait_until(lambda: GOOD2 not in shim.served, timeout=WAIT_S, what="good2 removed")

        assert sorted(shim.served) == [GOOD, STATIC]
        assert sorted(host(shim, "namer").sources) == [GOOD]
        assert {r.resource_name for r in kubelet.registrations} == {STATIC, GOOD, GOOD2}
        assert refused("namer", "invalid") == before + 2 * len(BAD_NAMES)
        for bad in BAD_NAMES:
            assert any("driver 'namer'" in w and repr(bad) in w for w in warnings), (bad, warnings)
        assert not any("handover" in w for w in warnings), warnings
        # The static resource was never disturbed (a glob once made it wait for a handover).
        assert not static.stream_ended.is_set() and registration_attempts(kubelet, STATIC) == 1

        def sockets() -> list[str]:
            return sorted(p.name.rsplit("-", 1)[0] for p in plugin_dir.glob("devshim-*"))

        # A removed resource's endpoint deletes its socket as it stops, after it left `served`.
        want = ["devshim-example.com_good", "devshim-example.com_static"]
        await until(lambda: sockets() == want, f"the sockets left are {want}")
    saved = sorted(p.name for p in (state_dir / "drivers" / "namer").iterdir() if not p.name.startswith("."))
    assert saved == ["example.com_good.json"]

"""A DRA pool's first-listed resource keeps its device names while its driver is not serving
(shim/dra/ownership.py): `devshim run` with real sim drivers and a real kube-apiserver, the honest
driver's inventory in the state dir, the honest driver held back at start and then taken out by a
reload, while a hostile driver lists the honest device IDs all along."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from shim.inventory import InventoryStore, SavedResource
from shim.model import Attribute, AttributeKind, Device
from tests.support import control_plane
from tests.support.dra import Published, dra_status, make_claim, running_devshim
from tests.support.dra_calls import (
    GPU,
    HONEST,
    HOSTILE,
    Devshim,
    granted_env,
    models,
    pool_config,
    prepare,
    sim_driver,
    status_when,
)
from tests.support.unix import short_temp_dir
from tests.support.waiting import until

NODE = "node-held"
HONEST_MODEL = (("model", Attribute(AttributeKind.STRING, "Honest")),)
# The honest driver starts once this file exists: held back, it serves nothing until then.
GATE = (
    "import os, sys, time\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.05)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-held-") as path:
        yield path


def sim_drivers(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The honest sim (gpu-0, gpu-1), behind the gate, and the hostile sim listing gpu-0, gpu-1
    and gpu-2 from the start."""
    honest = {"name": HONEST, "id_prefix": "gpu-", "count": 2, "attributes": {"model": {"string": "Honest"}}}
    hostile = {
        "name": HOSTILE,
        "id_prefix": "gpu-",
        "count": 3,
        "attributes": {"model": {"string": "Forged"}},
    }
    honest_driver, hostile_driver = (
        sim_driver(folder, who, {**sim, "grant": {"envs": {"SIM_DEVICES": f"{who}:{{ids}}"}}})
        for who, sim in (("honest", honest), ("hostile", hostile))
    )
    honest_driver["command"] = [sys.executable, "-c", GATE, str(folder / "gate"), *honest_driver["command"]]
    return honest_driver, hostile_driver


def write_config(folder: Path, plane: ControlPlane, drivers: list[dict[str, Any]]) -> Path:
    """One pool [HONEST, HOSTILE], served by ``drivers``."""
    return pool_config(folder, plane, NODE, drivers)


def hostile_calls(status: dict[str, Any]) -> set[str]:
    return {m for m, tally in status["drivers"]["hostile"]["calls"].items() if tally["ok"] or tally["failed"]}


async def test_a_hostile_resource_never_takes_the_names_an_honest_one_holds_while_its_driver_is_away(
    plane: ControlPlane, folder: Path
) -> None:
    """At start the honest driver is held back: its inventory keeps gpu-0 and gpu-1 its own. A
    reload then takes the honest driver out: its names stay held, so the hostile gpu-0 and gpu-1
    are never published and a claim for gpu-0 is refused, not prepared by the hostile driver (the
    clash says the names are held). Back, the honest driver prepares the claim."""
    version = control_plane.NEWEST_DRA[plane.minor]
    published = Published(plane, version, NODE)
    saved = SavedResource(
        (Device("gpu-0", attributes=HONEST_MODEL), Device("gpu-1", attributes=HONEST_MODEL)), ()
    )
    InventoryStore(folder / "state" / "drivers" / "honest").save(HONEST, saved)
    honest, hostile = sim_drivers(folder)
    config = write_config(folder, plane, [honest, hostile])
    async with running_devshim(config) as (proc, port):
        shim = Devshim(folder, config, port, proc)
        pool = await published.until(lambda p: "gpu-2" in p, "the hostile driver's own device is published")
        before = models(pool)
        assert before == {"gpu-0": "Honest", "gpu-1": "Honest", "gpu-2": "Forged"}, "restored, held"

        write_config(folder, plane, [hostile])  # the honest driver taken out
        proc.send_signal(signal.SIGHUP)
        pool = await published.until(lambda p: models(p) != before, "the pool follows the reload")
        assert models(pool) == {"gpu-2": "Forged"}, "the held names are published by no one"
        status = await dra_status(port, lambda s: s[GPU]["devices"] == 1, "one device is published")
        assert (
            f"is {HONEST}'s device 'gpu-0' (held while {HONEST} is not served)" in status[GPU]["last_error"]
        )

        claim = make_claim(plane, version, "held-gpu", [("gpu", "gpu-0")], node=NODE)
        uid = claim["metadata"]["uid"]
        await until(shim.socket.exists, "the DRA socket is there")
        answer = (await prepare(shim, [claim]))[uid]
        assert f"resource {HONEST} of DRA driver {GPU} is not served now" in answer.error
        assert "allocate" not in hostile_calls(await status_when(port, lambda s: True))

        (folder / "gate").touch()
        write_config(folder, plane, [honest, hostile])
        proc.send_signal(signal.SIGHUP)
        await status_when(port, lambda s: s["drivers"].get("honest", {}).get("status") == "up")
        await published.until(
            lambda p: models(p) == {"gpu-0": "Honest", "gpu-1": "Honest", "gpu-2": "Forged"}, "honest is back"
        )
        assert (await prepare(shim, [claim]))[uid].error == ""
        assert granted_env(shim, uid) == ["SIM_DEVICES=honest:gpu-0"], "prepared by the honest driver"
        assert "allocate" not in hostile_calls(await status_when(port, lambda s: True))

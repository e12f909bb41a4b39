"""Binding conditions (driver protocol 1.4; resource.k8s.io bindingConditions, beta and on in 1.36):
a device that needs an attach step before a pod using it binds.

`devshim run` with a sim driver one of whose GPUs declares a binding, against a real
kube-apiserver: the slice devshim publishes passes the server's validation with the binding on the
device; a claim allocated as the scheduler leaves it (each result with the device's conditions,
the allocation stamped with its time) gets the driver's attach answer in its status.devices, which
the server validates too (an allocated device, well-formed conditions); a failing attach is
written as the failure condition, which makes the scheduler place the pod again. The real
kube-scheduler waiting for the conditions is in test_real_node_dra.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases as upstream
from tests.support import control_plane
from tests.support.dra import Published, dra_status, make_claim, running_devshim
from tests.support.dra_calls import GPU, Devshim, pool_config, sim_driver, status_when
from tests.support.unix import short_temp_dir

NODE = "node-binding"
ATTACHED, FAILED = "gpu.example.com/attached", "gpu.example.com/attach-failed"
BINDING = {"conditions": [ATTACHED], "failure_conditions": [FAILED], "binds_to_node": True}
SIM: dict[str, Any] = {
    "name": "example.com/gpu",
    "devices": [{"id": "gpu-0", "binding": BINDING}, {"id": "gpu-1"}],
    "grant": {"envs": {"SIM_DEVICES": "{ids}"}},
    "attach": True,
}
COPIED = {"bindingConditions": [ATTACHED], "bindingFailureConditions": [FAILED]}  # into a result


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-bind-") as path:
        yield path


def settings(folder: Path, plane: ControlPlane, answer: str = "attached", on: bool = True) -> Path:
    """devshim's config in ``folder``: the sim's attach answering ``answer``, binding conditions
    ``on`` for the DRA driver."""
    sim = SIM | {"attach_answer": answer}
    pools = [{"name": GPU, "resources": [SIM["name"]], "binding_conditions": on}]
    return pool_config(folder, plane, NODE, [sim_driver(folder, "gpus", sim)], pools)


@asynccontextmanager
async def devshim(config: Path) -> AsyncIterator[Devshim]:
    async with running_devshim(config) as (proc, port):
        await dra_status(port, lambda s: s[GPU]["devices"] == 2, "the pool served")
        yield Devshim(config.parent, config, port, proc)


async def conditions_of(plane: ControlPlane, claim: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    """The claim's status.devices entry for gpu-0, once it holds conditions, by type."""
    path = f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{claim['metadata']['name']}"
    async with asyncio.timeout(timeout):
        while True:
            read = await asyncio.to_thread(plane.request, "GET", path)
            for entry in read.get("status", {}).get("devices") or ():
                if entry["device"] == "gpu-0" and entry.get("conditions"):
                    assert (entry["driver"], entry["pool"]) == (GPU, NODE)
                    return {c["type"]: c for c in entry["conditions"]}
            await asyncio.sleep(0.1)


def attached(status: dict[str, Any]) -> int:
    """The sim's attach calls answered, as /status counts them (a call is listed once asked)."""
    return int(status["drivers"]["gpus"]["calls"].get("attach", {}).get("ok", 0))


def detached(status: dict[str, Any]) -> int:
    """The sim's detach calls answered, as /status counts them."""
    return int(status["drivers"]["gpus"]["calls"].get("detach", {}).get("ok", 0))


def free(plane: ControlPlane, claim: dict[str, Any]) -> None:
    """What the scheduler does to a claim whose binding failed or timed out: its status cleared."""
    path = f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{claim['metadata']['name']}"
    current = plane.request("GET", path)
    plane.request("PUT", f"{path}/status", {**current, "status": {}})


async def test_a_device_with_a_binding_is_published_and_attached_once_allocated(
    plane: ControlPlane, folder: Path
) -> None:
    async with devshim(settings(folder, plane)) as shim:
        pool = await Published(plane, "v1", NODE).until(lambda p: len(p) == 2, "both GPUs")
        assert {k: pool["gpu-0"].get(k) for k in (*COPIED, "bindsToNode")} == COPIED | {"bindsToNode": True}
        assert not {*COPIED, "bindsToNode"} & set(pool["gpu-1"])
        claim = make_claim(plane, "v1", "attach-me", [("gpu", "gpu-0")], node=NODE, binding=COPIED)
        said = await conditions_of(plane, claim)
        assert said[ATTACHED]["status"] == "True" and said[ATTACHED]["reason"] == "Attached"
        assert FAILED not in said
        status = await status_when(
            shim.port,
            lambda s: s["dra"][GPU]["binding"]["attached"] == 1 and attached(s) >= 1,
        )
        assert status["dra"][GPU]["binding"]["failed"] == 0
        assert status["drivers"]["gpus"]["calls"]["attach"]["ok"] == 1
        # The scheduler frees the claim (a binding failure elsewhere, say): the device is detached.
        free(plane, claim)
        await status_when(shim.port, lambda s: detached(s) == 1)


async def test_devshim_restarted_does_not_attach_an_answered_device_again(
    plane: ControlPlane, folder: Path
) -> None:
    claim = make_claim(plane, "v1", "answered", [("gpu", "gpu-0")], node=NODE, binding=COPIED)
    config = settings(folder, plane)
    async with devshim(config):
        said = await conditions_of(plane, claim)
    async with devshim(config) as again:
        # Its list of claims is whole once the pool is served; a later claim proves the watch runs.
        later = make_claim(plane, "v1", "later", [("gpu", "gpu-0")], node=NODE, binding=COPIED)
        await conditions_of(plane, later)
        # /status is a snapshot up to 0.2 s old: the later answer and its driver call both in it.
        status = await status_when(
            again.port,
            lambda s: s["dra"][GPU]["binding"]["attached"] >= 1 and attached(s) >= 1,
        )
        assert status["dra"][GPU]["binding"]["attached"] == 1
        assert status["dra"][GPU]["binding"]["failed"] == 0  # its restored devices keep their binding
        assert status["drivers"]["gpus"]["calls"]["attach"]["ok"] == 1  # the later claim's alone
    assert (await conditions_of(plane, claim))[ATTACHED]["lastTransitionTime"] == said[ATTACHED][
        "lastTransitionTime"
    ]
    # Deleted while devshim is down: detached at its next start (it kept what it attached).
    plane.request(
        "DELETE", f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{claim['metadata']['name']}"
    )
    async with devshim(config) as third:
        await status_when(third.port, lambda s: detached(s) == 1)


async def test_a_failed_attach_is_written_as_the_failure_condition(plane: ControlPlane, folder: Path) -> None:
    async with devshim(settings(folder, plane, answer="failed")) as shim:
        claim = make_claim(plane, "v1", "no-attach", [("gpu", "gpu-0")], node=NODE, binding=COPIED)
        said = await conditions_of(plane, claim)
        assert said[FAILED]["status"] == "True" and said[FAILED]["reason"] == "AttachFailed"
        assert "could not be attached" in said[FAILED]["message"]
        assert ATTACHED not in said
        await status_when(shim.port, lambda s: s["dra"][GPU]["binding"]["attached"] == 1)


async def test_without_binding_conditions_in_the_config_the_binding_is_not_published(
    plane: ControlPlane, folder: Path
) -> None:
    async with devshim(settings(folder, plane, on=False)) as shim:
        pool = await Published(plane, "v1", NODE).until(lambda p: len(p) == 2, "both GPUs")
        assert not {*COPIED, "bindsToNode"} & set(pool["gpu-0"])
        status = await status_when(shim.port, lambda s: s["dra"][GPU]["rounds"] >= 1)
        assert "binding" not in status["dra"][GPU]  # no claims watched
    assert "dra.drivers[].binding_conditions is off" in (folder / "devshim.log").read_text()


BINDINGS_ON_BY_DEFAULT = 36  # DRADeviceBindingConditions: alpha and off in 1.34-1.35, beta and on in 1.36


@pytest.mark.parametrize("release", [control_plane.param(r) for r in control_plane.APISERVERS[:-1]])
async def test_an_older_api_server_drops_the_binding_and_devshim_says_so(
    release: upstream.Release, folder: Path
) -> None:
    """--full-matrix: before 1.36 the gate is off (and 1.33 has no such field): the server keeps
    the device and drops its binding without an error; devshim says the gate in /status. With the
    gate turned on (1.34 on), that release's validation takes the binding."""
    gates = [["DRADeviceBindingConditions"]] if release.minor >= 34 else []
    for gates_on in ([], *gates):
        with control_plane.running(release, gates_on=gates_on) as plane:
            version = control_plane.NEWEST_DRA[plane.minor]
            (here := folder / f"gates-{len(gates_on)}").mkdir()
            async with devshim(settings(here, plane)) as shim:
                pool = await Published(plane, version, NODE).until(lambda p: len(p) == 2, "both GPUs")
                status = await status_when(shim.port, lambda s: s["dra"][GPU]["rounds"] >= 1)
        described = pool["gpu-0"].get("basic", pool["gpu-0"])
        if gates_on or release.minor >= BINDINGS_ON_BY_DEFAULT:
            assert described.get("bindingConditions") == [ATTACHED], described
            assert status["dra"][GPU]["dropped"] == []
        else:
            assert "bindingConditions" not in described
            assert status["dra"][GPU]["dropped"] == ["DRADeviceBindingConditions"]

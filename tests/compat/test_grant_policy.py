"""The grant policy end to end: a real driver subprocess grants outside it, the fake kubelet
sees Allocate fail with PERMISSION_DENIED naming the field, and devshim keeps serving.

The driver is tests/support/drivers/granting.py; next to it devshim serves a static resource
whose configured device node lies inside its policy as written but is a symlink leading out
(what a static grant says is checked when the config loads; where it leads, on every call).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from shim.bootstrap import Shim
from shim.kubelet import FakeKubelet, PluginSession
from shim.kubelet.records import HEALTHY
from shim.ops import series
from shim.settings import Settings
from tests.support import DRIVERS
from tests.support.drivers.granting import DECLARED, PER_CALL, PER_CALL_IDS

DRIVER = DRIVERS / "granting.py"
STATIC = "example.com/static-mount"
WAIT_S = 20.0
SHM_LINK = Path("/dev/shm") / f"devshim-test-granting-{os.getpid()}"
VERSIONS = [
    pytest.param(("v1beta1",), id="v1beta1"),
    pytest.param(("v1beta1", "v1beta2"), id="v1beta2"),
]


@dataclass
class World:
    kubelet: FakeKubelet
    shim: Shim
    allowed: Path
    deallocated: Path

    async def session(self, resource: str) -> PluginSession:
        session = await self.kubelet.wait_for_plugin(resource, timeout=WAIT_S)
        await session.wait_for_list(lambda ds: bool(ds), timeout=WAIT_S)
        return session


@asynccontextmanager
async def world(
    plugin_dir: Path, state_dir: Path, tmp: Path, versions: tuple[str, ...]
) -> AsyncIterator[World]:
    """devshim with the granting driver (its per-call resource may use nodes under /dev and a
    temp dir, where a symlink leads out) and a static resource granting that symlink."""
    allowed, secret = tmp / "allowed", tmp / "secret"
    allowed.mkdir()
    secret.write_text("x")
    (allowed / "escape").symlink_to(secret)
    deallocated = tmp / "deallocated"
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        api_versions=list(versions),
        resources=[
            {
                "name": STATIC,
                "static": {
                    "count": 1,
                    "grant": {
                        "device_nodes": [{"container_path": "/dev/x", "host_path": str(allowed / "escape")}]
                    },
                },
                "policy": {"device_path_prefixes": [str(allowed)]},
            }
        ],
        drivers=[
            {
                "name": "granting",
                "command": [sys.executable, str(DRIVER)],
                "env": {
                    "ESCAPE_PATH": str(allowed / "escape"),
                    "DEALLOCATED": str(deallocated),
                    "SHM_LINK": str(SHM_LINK),
                },
                "resource_policies": {PER_CALL: {"device_path_prefixes": ["/dev", str(allowed)]}},
            }
        ],
    )
    async with FakeKubelet(plugin_dir, versions=versions) as kubelet, Shim(settings) as shim:
        yield World(kubelet, shim, allowed, deallocated)


def refusals(resource: str, field: str) -> float:
    labels = {"resource": resource, "field": field}
    return series.REGISTRY.get_sample_value("devshim_policy_refusals_total", labels) or 0.0


async def refused(session: PluginSession, device_ids: list[str]) -> str:
    """The details of an Allocate that must fail PERMISSION_DENIED."""
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await session.allocate(device_ids)
    assert failure.value.code() is grpc.StatusCode.PERMISSION_DENIED, failure.value
    return failure.value.details() or ""


@pytest.mark.parametrize("versions", VERSIONS)
async def test_a_per_call_grant_outside_the_policy_is_refused_and_devshim_keeps_serving(
    plugin_dir: Path, state_dir: Path, tmp_path: Path, warnings: list[str], versions: tuple[str, ...]
) -> None:
    """A symlink out of an allowed prefix, a writable mount of /etc and LD_PRELOAD each fail
    Allocate with PERMISSION_DENIED naming the field; each is counted and logged naming the
    driver; the driver hears the devices are free; and then an allowed Allocate succeeds, the
    stream is still open with every device Healthy, and the driver was never restarted."""
    async with world(plugin_dir, state_dir, tmp_path, versions) as w:
        session = await w.session(PER_CALL)
        assert session.version == versions[-1]
        before = refusals(PER_CALL, "device_nodes.host_path")

        details = await refused(session, ["escape"])
        assert details.startswith(f"{PER_CALL}: grant policy refuses device_nodes[0].host_path ")
        assert f"resolves to {str(tmp_path / 'secret')!r}" in details
        assert refusals(PER_CALL, "device_nodes.host_path") == before + 1
        assert any(
            m.startswith(f"{PER_CALL}: driver 'granting' granted device_nodes[0].host_path") for m in warnings
        )

        assert "mounts[0].host_path '/etc'" in await refused(session, ["mount"])
        assert "envs['LD_PRELOAD']" in await refused(session, ["preload"])
        # One allowed device does not carry a forbidden one through.
        assert "envs['LD_PRELOAD']" in await refused(session, ["ok-1", "preload"])

        grant = await session.allocate(["ok-0"])
        assert grant.device_nodes == (("/dev/ok-0", "/dev/null", "rw"),)
        assert grant.envs == {"GRANTING": "ok-0"}
        assert not session.stream_ended.is_set(), session.stream_error
        assert [(d.id, d.health) for d in session.latest] == [(i, HEALTHY) for i in PER_CALL_IDS]
        assert w.shim.drivers[0].failures == 0

        async def freed() -> list[str]:
            while not w.deallocated.exists() or len(w.deallocated.read_text().splitlines()) < 4:
                await asyncio.sleep(0.02)
            return w.deallocated.read_text().splitlines()

        async with asyncio.timeout(WAIT_S):
            deallocated = await freed()
        assert deallocated == ["escape", "mount", "preload", "ok-1,preload"]


async def test_a_declared_grant_outside_the_policy_is_refused_without_a_driver_call(
    plugin_dir: Path, state_dir: Path, tmp_path: Path, warnings: list[str]
) -> None:
    """Grants declared at list time are answered by devshim alone, and checked all the same."""
    async with world(plugin_dir, state_dir, tmp_path, ("v1beta1",)) as w:
        session = await w.session(DECLARED)
        calls = w.shim.drivers[0].calls.get("allocate")
        details = await refused(session, ["d-escape"])
        assert "device_nodes[0].host_path '/dev/../etc/shadow'" in details
        assert "normalises to '/etc/shadow'" in details
        assert (await session.allocate(["d-ok"])).device_nodes == (("/dev/d", "/dev/null", "rw"),)
        assert w.shim.drivers[0].calls.get("allocate") == calls  # no round trip either time
        assert refusals(DECLARED, "device_nodes.host_path") >= 1


async def test_a_static_grant_outside_the_policy_is_refused_too(
    plugin_dir: Path, state_dir: Path, tmp_path: Path, warnings: list[str]
) -> None:
    """Every source is held to its policy: a configured node that resolves outside its prefix
    fails Allocate, and the log says the static grant did it."""
    async with world(plugin_dir, state_dir, tmp_path, ("v1beta1",)) as w:
        session = await w.session(STATIC)
        escape = str(w.allowed / "escape")
        details = await refused(session, ["dev0"])
        assert f"device_nodes[0].host_path {escape!r}" in details and "resolves to" in details
        assert (
            f"{STATIC}: the static grant granted device_nodes[0].host_path {escape!r} outside the policy"
            in " ".join(warnings)
        )
        assert not session.stream_ended.is_set()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this machine")
async def test_what_a_node_is_and_whose_cdi_device_it_is_are_judged_end_to_end(
    plugin_dir: Path, state_dir: Path, tmp_path: Path, warnings: list[str]
) -> None:
    """/dev itself is no device; a link to /dev/null in world-writable /dev/shm could be
    repointed by anyone before the runtime opens it; a driver for example.com may not hand out
    nvidia.com's CDI devices. Each fails Allocate naming its rule, and devshim keeps serving."""
    SHM_LINK.symlink_to("/dev/null")
    try:
        async with world(plugin_dir, state_dir, tmp_path, ("v1beta1",)) as w:
            session = await w.session(PER_CALL)
            assert "'/dev' is a directory, and device_node_types allows char devices only" in await refused(
                session, ["dev"]
            )
            shm = await refused(session, ["shm"])
            assert f"device_nodes[0].host_path {str(SHM_LINK)!r}" in shm
            assert "passes through '/dev/shm', which anyone may write to" in shm
            cdi = await refused(session, ["cdi"])
            assert "cdi_devices[1] 'nvidia.com/gpu=all': not of an allowed CDI vendor (example.com" in cdi
            assert (await session.allocate(["ok-0"])).device_nodes == (("/dev/ok-0", "/dev/null", "rw"),)
            assert w.shim.drivers[0].failures == 0
    finally:
        SHM_LINK.unlink()

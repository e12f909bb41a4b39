"""What the soak found in devshim, each kept as a small regression test beside the fix.

- A Register in flight when devshim's socket is deleted waited out the kubelet's 10 s dial
  (fixed: deviceplugin/endpoint/cycle.py races the Register against the restart signal).
- A frozen driver took over 2 s to replace (fixed: driverhost/process.py SIGKILLs a hung run at once).
- A driver whose input pipe broke was never failed (fixed: driverhost/process.py request()).
- An Allocate in flight when devshim served again was cancelled (fixed: deviceplugin/endpoint/server.py
  PluginServer.close ends the streams, then gives unary calls a grace period).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import grpc
import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.compat.fakekubelet.records import RegisterRequest
from shim.settings import Settings
from tests.soak.invariants import RECOVERY_BUDGET_S
from tests.soak.runner import SoakOptions, run_soak
from tests.support import DRIVERS
from tests.support.drivers import holding
from tests.support.shim_fixtures import FOO, logged, running_shim
from tests.support.waiting import bounded, until


async def test_a_socket_deleted_while_its_register_is_in_flight_is_served_again_at_once(
    plugin_dir: Path, state_dir: Path
) -> None:
    """A kubelet that restarts in an instant (or anyone) removes devshim's socket after devshim
    sent Register but before the kubelet dialled it: the kubelet's dial can only time out (10 s),
    so devshim must abandon that Register, serve a new socket and register again at once."""
    deleted: list[float] = []

    async def delete_the_socket_once(request: RegisterRequest, received_at: float) -> None:
        if not deleted:  # before the kubelet dials: the socket the Register names is gone
            (plugin_dir / request.endpoint).unlink()
            deleted.append(time.monotonic())

    async with (
        FakeKubelet(plugin_dir, on_register=delete_the_socket_once) as kubelet,
        running_shim(plugin_dir, {FOO: {"count": 2}}, state_dir=state_dir),
    ):
        await kubelet.wait_for_registration(FOO, timeout=RECOVERY_BUDGET_S + 1)
        assert deleted, "the first Register should have found the socket deleted"
        session = await kubelet.wait_for_plugin(FOO)
        assert len(await session.wait_for_list()) == 2


@pytest.mark.timeout(120)
async def test_a_frozen_driver_is_replaced_within_the_recovery_budget() -> None:
    """A driver frozen for good (SIGSTOP) while the kubelet allocates from it: devshim finds it by
    the Allocate timeout, and within 2 s the kubelet lists its devices Healthy again."""
    options = SoakOptions(faults=1, seed=3, kinds=("driver_freeze",), overlap=0)
    report = await bounded(run_soak(options), 110, "a soak of one freeze")  # before pytest's 120 s
    freeze = report["faults"]["driver_freeze"]
    (variant,) = freeze["variants"]
    assert variant.endswith("found by a call timeout"), freeze
    assert freeze["recovery_max_s"] <= RECOVERY_BUDGET_S, freeze


DEAF_DRIVER = Path(__file__).with_name("deaf_driver.py")


async def test_a_driver_that_stops_reading_its_input_is_failed_and_restarted(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """A driver whose input pipe breaks (it closed stdin, or it died just as devshim wrote; the
    soak saw the latter once in 35,000 Allocates) is a failed driver: the Allocate fails
    UNAVAILABLE naming it, and its devices are listed Unhealthy until devshim has restarted it."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        deallocation={"enabled": False},
        drivers=[
            {
                "name": "deaf",
                "user": "root",
                "command": [sys.executable, str(DEAF_DRIVER)],
                "resources": ["example.com/deaf"],
            }
        ],
    )
    async with Shim(settings):
        session = await kubelet.wait_for_plugin("example.com/deaf", timeout=30)
        await session.wait_for_list(lambda devices: len(devices) == 2)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await session.allocate(["d-0"])
        details = failure.value.details() or ""
        assert failure.value.code() is grpc.StatusCode.UNAVAILABLE, details
        assert "driver 'deaf'" in details, details
        await session.wait_for_list(lambda devices: not any(d.healthy for d in devices), timeout=2)


async def test_an_allocate_in_flight_when_devshim_serves_again_is_still_answered(
    plugin_dir: Path, state_dir: Path, kubelet: FakeKubelet
) -> None:
    """devshim's own socket deleted while the kubelet waits on an Allocate: devshim serves a new
    socket and registers again, and the call in flight on the old one is answered. It used to be
    cancelled, reaching the kubelet as gRPC's "Cancelling all calls" (4 of 32,518 Allocates in the
    1,000-fault soak): the old server now ends its streams and gives unary calls a grace period."""
    drivers = [
        {
            "name": "holding",
            "user": "root",
            "command": [sys.executable, str(DRIVERS / "holding.py")],
            "resources": [holding.RESOURCE],
        }
    ]
    with logged("INFO") as logs:
        async with running_shim(plugin_dir, {}, state_dir=state_dir, drivers=drivers):
            session = await kubelet.wait_for_plugin(holding.RESOURCE, timeout=20)
            await session.wait_for_list()
            call = asyncio.create_task(session.allocate(["h-0"]))
            await until(lambda: any(holding.ARRIVED in m for m in logs), "the driver has the Allocate")
            assert not call.done()  # the driver holds it for HOLD_S
            (plugin_dir / session.endpoint).unlink()
            async with asyncio.timeout(5):
                grant = await call
            assert grant.envs == {} and grant.device_nodes == ()
            await kubelet.wait_for_registration(holding.RESOURCE, count=2, timeout=RECOVERY_BUDGET_S + 1)
            again = await kubelet.wait_for_plugin(holding.RESOURCE)
            assert again is not session and len(await again.wait_for_list()) == 2

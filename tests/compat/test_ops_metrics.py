"""devshim's Prometheus metrics, scraped over HTTP from a real devshim serving the fake kubelet.

The registry is shared by every test in the process, so each test serves resources of its
own name and compares scrapes taken before and after what it does.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import grpc
import pytest
import yaml

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.compat.fakekubelet.records import RegisterRequest
from shim.model import Health
from shim.settings import Settings
from tests.support.scrape import Samples, ops_for, scrape, scrape_until
from tests.support.shim_fixtures import running_shim, settings_for

RPCS = "devshim_rpc_requests_total"
DURATION_COUNT = "devshim_rpc_duration_seconds_count"
DRIVER_CALLS = "devshim_driver_calls_total"


def devices(samples: Samples, resource: str) -> dict[str, float]:
    return {h: samples.get("devshim_devices", resource=resource, health=h) for h in ("Healthy", "Unhealthy")}


async def test_allocate_calls_are_counted_by_the_code_the_kubelet_got_and_timed(
    plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    """Two good Allocates count twice as OK, an unknown device once as INVALID_ARGUMENT, and
    all three are in the latency histogram; every other kubelet-facing RPC is counted too."""
    name = "example.com/ops-alloc"
    async with running_shim(plugin_dir, {name: {"count": 2, "pre_start": True}}) as (shim, _):
        session = await kubelet.wait_for_plugin(name)
        await session.wait_for_list()
        async with ops_for(shim) as ops:
            labels = {"resource": name, "version": "v1beta1", "method": "Allocate"}
            before = await scrape(ops.port)
            await session.allocate(["dev0"])
            await session.allocate(["dev1"])
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await session.allocate(["ghost"])
            await session.preferred_allocation(["dev0", "dev1"], [], 1)
            await session.prestart(["dev0"])
            after = await scrape(ops.port)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert after.since(before, RPCS, **labels, code="OK") == 2
    assert after.since(before, RPCS, **labels, code="INVALID_ARGUMENT") == 1
    assert after.since(before, DURATION_COUNT, **labels) == 3
    for method in ("GetPreferredAllocation", "PreStartContainer"):
        assert after.since(before, RPCS, resource=name, version="v1beta1", method=method, code="OK") == 1
    for method in ("GetDevicePluginOptions", "ListAndWatch"):  # as the kubelet connected
        assert after.get(RPCS, resource=name, version="v1beta1", method=method, code="OK") >= 1
    assert after.get("devshim_list_messages_total", resource=name, version="v1beta1") >= 1


async def test_the_devices_gauge_follows_each_published_list_and_goes_with_the_resource(
    plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    """Healthy/Unhealthy counts equal the list the kubelet has, change with a health flip, and
    the resource's series (devices, version in use) are gone once it is no longer served."""
    name = "example.com/ops-devices"
    async with running_shim(plugin_dir, {name: {"count": 4}}) as (shim, sources), ops_for(shim) as ops:
        session = await kubelet.wait_for_plugin(name)
        await session.wait_for_list()
        first = await scrape(ops.port)
        await sources[name].set_health("dev2", Health.UNHEALTHY)
        await session.wait_for_list(lambda devices: not devices[2].healthy)
        flipped = await scrape(ops.port)
    async with ops_for(shim) as ops:
        gone = await scrape(ops.port)
    assert devices(first, name) == {"Healthy": 4, "Unhealthy": 0}
    assert devices(flipped, name) == {"Healthy": 3, "Unhealthy": 1}
    assert first.get("devshim_negotiated_version_info", resource=name, version="v1beta1") == 1
    assert not gone.has("devshim_devices", resource=name)
    assert not gone.has("devshim_negotiated_version_info", resource=name)


async def test_registrations_versions_and_kubelet_restarts_follow_the_kubelet(plugin_dir: Path) -> None:
    """A refused Register counts as failed and its retry as ok; the version in use is v1beta2
    with a v1beta2 kubelet, then v1beta1 alone after it restarts as a v1beta1 kubelet, and the
    restart is counted once."""
    name = "example.com/ops-register"
    refusals = [RuntimeError("not yet")]

    async def refuse_once(request: RegisterRequest, received_at: float) -> None:
        if refusals:
            raise refusals.pop()

    settings = settings_for(plugin_dir, {name: {"count": 1}}, api_versions=["v1beta1", "v1beta2"])
    versions = ("v1beta1", "v1beta2")
    kubelet = FakeKubelet(plugin_dir, versions=versions, on_register=refuse_once)
    async with kubelet, Shim(settings) as shim, ops_for(shim) as ops:
        await kubelet.wait_for_registration(name)
        # The kubelet has the Register before devshim has its answer and counts it.
        ok = {"resource": name, "version": "v1beta2", "outcome": "ok"}
        registered = await scrape_until(ops.port, lambda s: s.get("devshim_registrations_total", **ok) == 1)
        await kubelet.restart(versions=["v1beta1"])
        await kubelet.wait_for_registration(name, count=2)
        restarted = await scrape_until(
            ops.port,
            lambda s: s.get("devshim_negotiated_version_info", resource=name, version="v1beta1") == 1,
        )
    outcomes = {"resource": name, "version": "v1beta2"}
    assert registered.get("devshim_registrations_total", **outcomes, outcome="failed") == 1
    assert registered.get("devshim_registrations_total", **outcomes, outcome="ok") == 1
    assert registered.get("devshim_negotiated_version_info", **outcomes) == 1
    assert restarted.get("devshim_registrations_total", resource=name, version="v1beta1", outcome="ok") == 1
    assert not restarted.has("devshim_negotiated_version_info", **outcomes)
    assert registered.total("devshim_kubelet_restarts_total", resource=name) == 0
    # Noticed once, though the stream ended and kubelet.sock was re-created.
    assert restarted.total("devshim_kubelet_restarts_total", resource=name) == 1


async def test_a_drivers_calls_and_its_restart_after_sigkill_are_counted(
    plugin_dir: Path, state_dir: Path
) -> None:
    """A driver's calls count by method and outcome, v1beta2's Deallocate and PostStopContainer
    are counted like every RPC, and a SIGKILLed driver counts one restart."""
    name, driver = "example.com/ops-sim", "ops-sim"
    config = state_dir / "sim.yaml"
    resource = {"name": name, "count": 2, "deallocate": True, "post_stop": True}
    config.write_text(yaml.safe_dump({"resources": [resource]}))
    command = [sys.executable, "-m", "devshim_adapters.sim", "--config", str(config)]
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        api_versions=["v1beta1", "v1beta2"],
        drivers=[{"name": driver, "user": "root", "command": command, "resources": [name]}],
    )
    versions = ("v1beta1", "v1beta2")
    async with FakeKubelet(plugin_dir, versions=versions) as kubelet, Shim(settings) as shim:
        session = await kubelet.wait_for_plugin(name, timeout=20)
        await session.wait_for_list()
        async with ops_for(shim) as ops:
            first = session.latest[0].id
            before = await scrape(ops.port)
            await session.allocate([first])
            await session.post_stop([first])
            await session.deallocate([first])
            calls = await scrape(ops.port)
            process = shim.drivers[0].process
            assert process is not None
            os.kill(process.pid, signal.SIGKILL)
            restarted = await scrape_until(
                ops.port, lambda s: s.get("devshim_driver_restarts_total", driver=driver) > 0
            )
            # Unhealthy during the outage, Healthy again once the new run lists its devices.
            await session.wait_for_list(lambda devices: all(d.healthy for d in devices), timeout=20)

    for method in ("allocate", "post_stop", "deallocate"):
        assert calls.since(before, DRIVER_CALLS, driver=driver, method=method, outcome="ok") == 1, method
    for method in ("Allocate", "PostStopContainer", "Deallocate"):
        assert calls.since(before, RPCS, resource=name, version="v1beta2", method=method, code="OK") == 1
    assert restarted.get("devshim_driver_restarts_total", driver=driver) == 1
    assert restarted.get(DRIVER_CALLS, driver=driver, method="list_devices", outcome="ok") >= 1


async def test_label_values_never_hold_device_ids(plugin_dir: Path, kubelet: FakeKubelet) -> None:
    """After allocations of named devices, no series carries a device ID as a label value."""
    name = "example.com/ops-labels"
    devices = {"devices": [{"id": "secret-dev-a"}, {"id": "secret-dev-b"}]}
    async with running_shim(plugin_dir, {name: devices}) as (shim, _):
        session = await kubelet.wait_for_plugin(name)
        await session.wait_for_list()
        await session.allocate(["secret-dev-a"])
        with pytest.raises(grpc.aio.AioRpcError):
            await session.allocate(["secret-dev-zzz"])
        async with ops_for(shim) as ops:
            samples = await scrape(ops.port)
    values = {value for _, labels in samples.values for _, value in labels}
    assert name in values
    assert not [v for v in values if "secret-dev" in v]


async def test_a_plugin_watcher_registration_is_counted(plugin_dir: Path, state_dir: Path) -> None:
    """NotifyRegistrationStatus(true) counts as an ok registration; the watcher does not say
    which version it took, so that label is empty."""
    name = "example.com/ops-watcher"
    registry = state_dir / "plugins_registry"
    registry.mkdir()
    settings = settings_for(
        plugin_dir, {name: {"count": 1}}, registration="watcher", plugins_registry_dir=registry
    )
    kubelet = FakeKubelet(plugin_dir, plugins_registry=registry)
    async with kubelet, Shim(settings) as shim, ops_for(shim) as ops:
        await kubelet.wait_until(lambda: shim.ready()[0], what="the watcher's registration")
        samples = await scrape(ops.port)
    assert samples.get("devshim_registrations_total", resource=name, version="", outcome="ok") == 1
    assert samples.total("devshim_registrations_total", resource=name, outcome="failed") == 0

"""A vendor-style legacy plugin written in Go (tests/support/legacy_plugins/go: a Go module on the upstream
API package k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1, with its own server, Register and
ListAndWatch loop) behind the legacy adapter, devshim and the fake kubelet. Built in the test run
with the machine's Go, its dependencies from the Go module proxy as pinned in go.sum."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.legacy import legacy_pid, served

RESOURCE = "example.com/goplug"
# What the Go plugin's Allocate grants: an env, /dev/null as /dev/goplug/<id>, a CDI device.
POLICY = {"envs": ["GOPLUG_DEVICES"], "device_nodes": ["/dev/null"], "cdi_kinds": ["example.com/goplug"]}


@pytest.mark.parametrize(
    "register_first", [False, True], ids=["serve-then-register", "register-before-serve"]
)
async def test_the_go_plugin_behind_devshim_end_to_end(
    plugin_dir: Path, state_dir: Path, private_dir: Path, goplug: Path, register_first: bool
) -> None:
    """Register, list with NUMA nodes, options, preferred allocation, Allocate, pre-start, a health
    flip, and a crash the adapter restarts it from, all seen from the kubelet's side; also when
    the plugin registers before it serves."""
    command = [str(goplug), "-dir", str(private_dir), "-preferred", "-prestart"]
    if register_first:
        command.append("-register-before-serve")
    async with served(plugin_dir, state_dir, private_dir, command, {}, resource=RESOURCE, policy=POLICY) as (
        session,
        shim,
    ):
        assert [(d.id, d.numa_nodes) for d in session.latest] == [("g0", (0,)), ("g1", (1,)), ("g2", (0,))]
        assert session.options.pre_start_required and session.options.get_preferred_allocation_available
        assert await session.preferred_allocation(["g0", "g1", "g2"], ["g2"], 2) == ["g2", "g0"]
        grant = await session.allocate(["g1"])
        assert grant.envs == {"GOPLUG_DEVICES": "g1"}
        assert grant.device_nodes == (("/dev/goplug/g1", "/dev/null", "rw"),)
        assert grant.cdi_devices == ("example.com/goplug=g1",)
        await session.prestart(["g1"])
        os.kill(legacy_pid(shim), signal.SIGUSR1)
        await session.wait_for_list(lambda ds: not ds[2].healthy, timeout=10)
        os.kill(legacy_pid(shim), signal.SIGUSR2)  # exits with code 3: a crash
        await session.wait_for_list(lambda ds: len(ds) == 3 and not any(d.healthy for d in ds), timeout=10)
        back = await session.wait_for_list(lambda ds: len(ds) == 3 and all(d.healthy for d in ds), timeout=30)
        assert [d.id for d in back] == ["g0", "g1", "g2"]

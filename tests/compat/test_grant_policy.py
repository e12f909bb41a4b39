"""The grant policy end to end: a real driver subprocess grants outside what its operator
declared, the fake kubelet sees Allocate fail with PERMISSION_DENIED naming the field, the rule
and the setting that would allow it, and devshim keeps serving.

The driver is tests/support/drivers/granting.py; next to it devshim serves a static resource
whose configured device node lies inside its policy as written but is a symlink leading out
(what a static grant says is checked when the config loads; where it leads, on every call).
Under an allowlist written too broadly (every env name, everything under /dev) the floor still
refuses what it guards, until the operator lifts that one rule with ``unsafe``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet, PluginSession
from shim.compat.fakekubelet.records import HEALTHY
from shim.ops import series
from shim.settings import Settings
from tests.support import DRIVERS
from tests.support.drivers.granting import DECLARED, PER_CALL, PER_CALL_IDS, SHELL_ENVS

DRIVER = DRIVERS / "granting.py"
STATIC = "example.com/static-mount"
# The settings each refusal names as the one that would allow what it refused.
PER_CALL_POLICY = f"drivers[granting].resource_policies[{PER_CALL}]"
DRIVER_POLICY = "drivers[granting].policy"
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
                "policy": {"device_nodes": [f"{allowed}/*"]},
            }
        ],
        drivers=[
            {
                "name": "granting",
                "user": "root",
                "command": [sys.executable, str(DRIVER)],
                "env": {
                    "ESCAPE_PATH": str(allowed / "escape"),
                    "DEALLOCATED": str(deallocated),
                    "SHM_LINK": str(SHM_LINK),
                },
                "resources": [PER_CALL, DECLARED],
                # The declared resource's grants: /dev/null alone.
                "policy": {"device_nodes": ["/dev/null"]},
                # The per-call resource's: /dev itself among its nodes too, since a glob that
                # allows a directory does not make it a device (device_node_types still holds).
                "resource_policies": {
                    PER_CALL: {
                        "envs": ["GRANTING"],
                        "device_nodes": ["/dev", "/dev/**", f"{allowed}/*"],
                        "cdi_kinds": ["example.com/granting"],
                    }
                },
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
    """A symlink out of an allowed glob, a writable mount of /etc nobody declared and LD_PRELOAD
    (the floor's) each fail Allocate with PERMISSION_DENIED naming the field, the rule and the
    setting that would allow it; each is counted and logged naming the driver; the driver hears
    the devices are free; and then an allowed Allocate succeeds, the stream is still open with
    every device Healthy, and the driver was never restarted."""
    async with world(plugin_dir, state_dir, tmp_path, versions) as w:
        session = await w.session(PER_CALL)
        assert session.version == versions[-1]
        before = refusals(PER_CALL, "device_nodes.host_path")

        details = await refused(session, ["escape"])
        assert details.startswith(f"{PER_CALL}: grant policy refuses device_nodes[0].host_path ")
        secret = str(tmp_path / "secret")
        assert (
            f"it resolves to {secret!r}, which is not declared in {PER_CALL_POLICY}.device_nodes" in details
        )
        assert refusals(PER_CALL, "device_nodes.host_path") == before + 1
        assert any(
            m.startswith(f"{PER_CALL}: driver 'granting' granted device_nodes[0].host_path") for m in warnings
        )

        # /etc holds /etc/shadow and /etc/kubernetes: the floor refuses it, declared or not.
        mount = await refused(session, ["mount"])
        assert "mounts[0].host_path '/etc': the floor's rule mount.secrets refuses it (" in mount
        assert mount.endswith(f"; only {PER_CALL_POLICY}.unsafe: {{mount.secrets: true}} lifts it")
        preload = await refused(session, ["preload"])
        assert "envs['LD_PRELOAD'] 'LD_PRELOAD': the floor's rule env.loader refuses it (" in preload
        assert preload.endswith(f"; only {PER_CALL_POLICY}.unsafe: {{env.loader: true}} lifts it")
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
        assert (
            f"it normalises to '/etc/shadow', not declared: {DRIVER_POLICY}.device_nodes would allow it, "
            "e.g. [/etc/shadow]" in details
        )
        assert (await session.allocate(["d-ok"])).device_nodes == (("/dev/d", "/dev/null", "rw"),)
        assert w.shim.drivers[0].calls.get("allocate") == calls  # no round trip either time
        assert refusals(DECLARED, "device_nodes.host_path") >= 1


async def test_a_static_grant_outside_the_policy_is_refused_too(
    plugin_dir: Path, state_dir: Path, tmp_path: Path, warnings: list[str]
) -> None:
    """Every source is held to its policy: a configured node that resolves outside its glob
    fails Allocate, and the log says the static grant did it."""
    async with world(plugin_dir, state_dir, tmp_path, ("v1beta1",)) as w:
        session = await w.session(STATIC)
        escape = str(w.allowed / "escape")
        details = await refused(session, ["dev0"])
        assert f"device_nodes[0].host_path {escape!r}" in details
        assert (
            f"it resolves to {str(tmp_path / 'secret')!r}, which is not declared in "
            f"resources[{STATIC}].policy.device_nodes" in details
        )
        assert (
            f"{STATIC}: the static grant granted device_nodes[0].host_path {escape!r} outside the policy"
            in " ".join(warnings)
        )
        assert not session.stream_ended.is_set()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this machine")
async def test_what_a_node_is_and_whose_cdi_device_it_is_are_judged_end_to_end(
    plugin_dir: Path, state_dir: Path, tmp_path: Path, warnings: list[str]
) -> None:
    """/dev itself is no device, though a glob allows it; a link to /dev/null in world-writable
    /dev/shm could be repointed by anyone before the runtime opens it; a driver declared for
    example.com/granting's CDI devices may not hand out nvidia.com's. Each fails Allocate naming
    its rule, and devshim keeps serving."""
    SHM_LINK.symlink_to("/dev/null")
    try:
        async with world(plugin_dir, state_dir, tmp_path, ("v1beta1",)) as w:
            session = await w.session(PER_CALL)
            assert (
                f"'/dev' is a directory, and {PER_CALL_POLICY}.device_node_types allows char devices only"
                in await refused(session, ["dev"])
            )
            shm = await refused(session, ["shm"])
            assert f"device_nodes[0].host_path {str(SHM_LINK)!r}" in shm
            assert "passes through '/dev/shm', which anyone may write to " in shm
            assert shm.endswith(f"({PER_CALL_POLICY}.allow_world_writable_dirs)")
            cdi = await refused(session, ["cdi"])
            assert (
                f"cdi_devices[1] 'nvidia.com/gpu=all': not declared: {PER_CALL_POLICY}.cdi_kinds would allow "
                "it, e.g. [nvidia.com/gpu]" in cdi
            )
            assert (await session.allocate(["ok-0"])).device_nodes == (("/dev/ok-0", "/dev/null", "rw"),)
            assert w.shim.drivers[0].failures == 0
    finally:
        SHM_LINK.unlink()


# --- issue 41: a declaration allows kinds, not vendors; the floor holds under a broad one -------

X = "nvidia.com/x"


@asynccontextmanager
async def granting(
    plugin_dir: Path, state_dir: Path, policy: dict[str, Any], resource: str = PER_CALL, **env: str
) -> AsyncIterator[tuple[PluginSession, Shim]]:
    """devshim serving the granting driver's per-call resource as ``resource`` under ``policy``
    (its driver-wide one), and the kubelet's session of it with the first list in."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        drivers=[
            {
                "name": "granting",
                "user": "root",
                "command": [sys.executable, str(DRIVER)],
                "env": {"GRANTING_RESOURCE": resource, "DEALLOCATED": os.devnull, **env},
                "resources": [resource],
                "policy": policy,
            }
        ],
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings) as shim:
        session = await kubelet.wait_for_plugin(resource, timeout=WAIT_S)
        await session.wait_for_list(lambda ds: bool(ds), timeout=WAIT_S)
        yield session, shim


async def test_a_cdi_kind_declared_allows_that_kind_and_not_its_vendors_others(
    plugin_dir: Path, state_dir: Path, warnings: list[str]
) -> None:
    """Issue 41, attack 4 (second half): a driver declared for nvidia.com/x with cdi_kinds
    [nvidia.com/x] grants nvidia.com/gpu=all, every GPU of the node. Its vendor is the
    resource's, but its kind was never declared: Allocate fails naming cdi_kinds, while the kind
    declared is granted."""
    async with granting(plugin_dir, state_dir, {"cdi_kinds": [X]}, resource=X) as (session, shim):
        before = refusals(X, "cdi_devices")
        details = await refused(session, ["cdi-all"])
        assert details == (
            f"{X}: grant policy refuses cdi_devices[0] 'nvidia.com/gpu=all': not declared: "
            f"{DRIVER_POLICY}.cdi_kinds would allow it, e.g. [nvidia.com/gpu]"
        )
        assert refusals(X, "cdi_devices") == before + 1
        assert (await session.allocate(["cdi-own"])).cdi_devices == (f"{X}=0",)
        assert not session.stream_ended.is_set() and shim.drivers[0].failures == 0


@contextmanager
def terminal() -> Iterator[str]:
    """A pseudo-terminal's node (/dev/pts/N), open for the block: what a host's shell reads."""
    leader, follower = os.openpty()
    try:
        yield os.ttyname(follower)
    finally:
        os.close(follower)
        os.close(leader)


# An allowlist written too broadly: every env name, every node under /dev.
BROAD = {"envs": ["*"], "device_nodes": ["/dev/**"]}
FLOOR_CASES = [
    pytest.param("shell", "env.shell", "envs['SHELLOPTS'] 'SHELLOPTS'", "envs", id="shellopts-ps4"),
    pytest.param("pts", "device.terminal", "device_nodes[0].host_path '{pts}'", "device_nodes.host_path",
                 id="dev-pts"),
]  # fmt: skip


@pytest.mark.parametrize(("device", "rule", "field", "kind"), FLOOR_CASES)
async def test_the_floor_refuses_under_a_broad_allowlist_naming_its_rule(
    plugin_dir: Path, state_dir: Path, warnings: list[str], device: str, rule: str, field: str, kind: str
) -> None:
    """envs ["*"] and device_nodes ["/dev/**"] allow SHELLOPTS and PS4 (bash runs PS4's command
    as it traces its start) and a terminal of the host's by their allowlists; the floor refuses
    each naming its rule and the one setting that lifts it, and devshim keeps serving."""
    with terminal() as pts:
        async with granting(plugin_dir, state_dir, BROAD, PTS_PATH=pts) as (session, shim):
            before = refusals(PER_CALL, kind)
            details = await refused(session, [device])
            assert details.startswith(f"{PER_CALL}: grant policy refuses {field.format(pts=pts)}: ")
            assert f"the floor's rule {rule} refuses it (" in details
            assert details.endswith(f"; only {DRIVER_POLICY}.unsafe: {{{rule}: true}} lifts it")
            assert refusals(PER_CALL, kind) == before + 1
            assert (await session.allocate(["ok-0"])).envs == {"GRANTING": "ok-0"}
            assert not session.stream_ended.is_set() and shim.drivers[0].failures == 0
    assert not any("lifts the floor" in m for m in warnings)


async def test_the_floor_holds_where_a_link_leads(
    plugin_dir: Path, state_dir: Path, tmp_path: Path, warnings: list[str]
) -> None:
    """A node at a path the allowlist names that is a link to the host's terminal is refused by
    the floor for where it leads."""
    with terminal() as pts:
        link = tmp_path / "console"
        link.symlink_to(pts)
        policy = {"device_nodes": [str(tmp_path / "*")]}
        async with granting(plugin_dir, state_dir, policy, PTS_PATH=str(link)) as (session, _):
            details = await refused(session, ["pts"])
            assert details.startswith(
                f"{PER_CALL}: grant policy refuses device_nodes[0].host_path {str(link)!r}: "
            )
            assert f"it resolves to {pts!r}, which the floor's rule device.terminal refuses it (" in details


@pytest.mark.parametrize(("device", "rule", "field", "kind"), FLOOR_CASES)
async def test_unsafe_lifts_one_floor_rule_loudly(
    plugin_dir: Path, state_dir: Path, warnings: list[str], device: str, rule: str, field: str, kind: str
) -> None:
    """With ``unsafe: {RULE: true}`` the same grant is granted, devshim said so at start (a
    WARNING naming the resource, the setting and the rule), and the floor's other rules still
    hold (LD_PRELOAD)."""
    with terminal() as pts:
        policy = {**BROAD, "unsafe": {rule: True}}
        async with granting(plugin_dir, state_dir, policy, PTS_PATH=pts) as (session, shim):
            assert (
                f"{PER_CALL}: {DRIVER_POLICY} lifts the floor's rule(s) {rule}: its grants may hold what "
                "they guard" in warnings
            )
            grant = await session.allocate([device])
            if device == "shell":
                assert grant.envs == SHELL_ENVS
            else:
                assert [node[:2] for node in grant.device_nodes] == [("/dev/x", pts)]
            assert "the floor's rule env.loader refuses it" in await refused(session, ["preload"])
            assert shim.drivers[0].failures == 0

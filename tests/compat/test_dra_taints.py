"""Device taints (protocol 1.3) published on a real API server, judged by its validation.

The sim taints a device in its config and on command; devshim publishes the taint in the
server's newest resource.k8s.io version. Where the server's DRADeviceTaints gate is off (alpha
and off by default in 1.33-1.35), it drops the field without an error: devshim publishes the rest,
says so once in its log and in its status (``dropped``). With the gate turned on, the same slices
pass that release's validation. The newest release runs by default; --full-matrix adds the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases as upstream
from tests.support import control_plane
from tests.support.dra import Published, config, control, dra_status, running
from tests.support.unix import short_temp_dir

RELEASES = [control_plane.param(r) for r in control_plane.APISERVERS]
GATE = "DRADeviceTaints"
GATE_ON_BY_DEFAULT = 36  # beta and on in 1.36 (pkg/features), GA in 1.37
GPU = "example.com/gpu"
SIM = {
    "name": GPU,
    "devices": [
        {
            "id": "gpu-0",
            "taints": [{"key": "gpu.example.com/ecc-errors", "value": "3", "effect": "NoSchedule"}],
        },
        {"id": "gpu-1"},
    ],
}


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> upstream.Release:
    found: upstream.Release = request.param
    return found


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-taint-") as path:
        yield path


def taints(device: dict[str, Any], version: str) -> list[dict[str, Any]]:
    described = device.get("basic", {}) if version in ("v1beta1", "v1alpha3") else device
    return [{k: v for k, v in t.items() if k != "timeAdded"} for t in described.get("taints", [])]


async def _publish_and_retaint(plane: ControlPlane, folder: Path, node: str) -> dict[str, Any]:
    """Publishes SIM, then taints gpu-1 and clears gpu-0 by command; the final pool by name."""
    version = control_plane.NEWEST_DRA[plane.minor]
    published = Published(plane, version, node)
    async with running(config(folder, plane, node, SIM)) as devshim:
        pool = await published.until(lambda p: len(p) == 2, "both GPUs")
        first = taints(pool["gpu-0"], version)
        await control(folder, f"taint {GPU} gpu-1 example.com/going-away NoExecute")
        await control(folder, f"untaint {GPU} gpu-0")
        pool = await published.until(
            lambda p: not taints(p["gpu-0"], version) and (bool(taints(p["gpu-1"], version)) or first == []),
            "gpu-1 tainted, gpu-0 clear",
        )
        status = await dra_status(
            devshim.port, lambda s: s["gpu.example.com"]["generation"] >= 2, "republished"
        )
        return {
            "first": first,
            "pool": pool,
            "status": status["gpu.example.com"],
            "log": devshim.log.read_text(),
        }


async def test_taints_reach_the_slices_where_the_gate_is_on_and_are_said_dropped_where_not(
    release: upstream.Release, folder: Path
) -> None:
    with control_plane.running(release) as plane:
        seen = await _publish_and_retaint(plane, folder, "node-taint")
    version = control_plane.NEWEST_DRA[release.minor]
    ecc = [{"key": "gpu.example.com/ecc-errors", "value": "3", "effect": "NoSchedule"}]
    if release.minor >= GATE_ON_BY_DEFAULT:
        assert seen["first"] == ecc
        assert taints(seen["pool"]["gpu-1"], version) == [
            {"key": "example.com/going-away", "effect": "NoExecute"}
        ]
        assert seen["status"]["dropped"] == []
        assert "dropped" not in seen["log"]
    else:  # the gate is off by default: the server keeps the devices and drops their taints
        assert seen["first"] == []
        assert seen["status"]["dropped"] == [GATE]
        assert f"carry nothing that needs the feature gate {GATE}" in seen["log"]


@pytest.mark.parametrize("gated", [control_plane.param(r) for r in control_plane.APISERVERS[:-1]])
async def test_a_release_with_the_gate_turned_on_takes_devshims_taints(
    gated: upstream.Release, folder: Path
) -> None:
    """Older releases' validation judges devshim's taints too (--full-matrix: the newest has the gate
    on already and runs above)."""
    if gated.minor >= GATE_ON_BY_DEFAULT:
        pytest.skip(f"{GATE} is on by default in 1.{gated.minor}: the test above judges it")
    with control_plane.running(gated, gates_on=[GATE]) as plane:
        seen = await _publish_and_retaint(plane, folder, "node-gated")
    version = control_plane.NEWEST_DRA[gated.minor]
    assert seen["first"] == [{"key": "gpu.example.com/ecc-errors", "value": "3", "effect": "NoSchedule"}]
    assert taints(seen["pool"]["gpu-1"], version) == [
        {"key": "example.com/going-away", "effect": "NoExecute"}
    ]
    assert seen["status"]["dropped"] == []

"""Partitionable devices (protocol 1.3) published on a real API server, judged by its validation.

The sim serves a GPU and its two halves: the GPU brings the counter set gpu-0 (memory and slices)
and takes all of it, each half takes half. devshim publishes 1.36's shape: the set in a slice of
its own, each device's consumption beside its attributes. To an API server of 1.33-1.35 devshim
writes that release's shape (the sets in the devices' slice, behind an alpha gate): with the gate
off, as by default, the server drops the counters, and devshim says so in its log and /status;
with it on, the server takes them. The newest release runs by default; --full-matrix adds the
others.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shim.compat.upstream import releases as upstream
from tests.support import control_plane
from tests.support.dra import Published, config, running
from tests.support.unix import short_temp_dir

RELEASES = [control_plane.param(r) for r in control_plane.APISERVERS]
GATE = "DRAPartitionableDevices"
SHAPE_SINCE = 36
WHOLE = {"memory": "80Gi", "slices": "7"}
HALF = {"memory": "40Gi", "slices": "3"}
# A GPU and its two halves, as the sim's config says them.
SIM: dict[str, Any] = {
    "name": "example.com/gpu",
    "devices": [
        {"id": "gpu-0", "counter_sets": [{"name": "gpu-0", "counters": WHOLE}],
         "consumes_counters": [{"counter_set": "gpu-0", "counters": WHOLE}]},
        {"id": "gpu-0-a", "consumes_counters": [{"counter_set": "gpu-0", "counters": HALF}]},
        {"id": "gpu-0-b", "consumes_counters": [{"counter_set": "gpu-0", "counters": HALF}]},
    ],
}  # fmt: skip


@pytest.fixture
def folder() -> Iterator[Path]:
    with short_temp_dir("ds-part-") as path:
        yield path


def quantities(counters: dict[str, Any]) -> dict[str, str]:
    return {name: counter["value"] for name, counter in counters.items()}


@pytest.mark.parametrize("release", RELEASES)
async def test_a_gpu_and_its_halves_are_published_with_their_counters_in_1_36s_shape(
    release: upstream.Release, folder: Path
) -> None:
    version = control_plane.NEWEST_DRA[release.minor]
    with control_plane.running(release) as plane:
        published = Published(plane, version, "node-part")
        async with running(config(folder, plane, "node-part", SIM)) as devshim:
            pool = await published.until(lambda p: len(p) == 3, "the GPU and its halves")
            status = await devshim.status(
                lambda s: s["dra"]["gpu.example.com"]["generation"] >= 1, "published"
            )
            slices = published.slices()
            log = devshim.log.read_text()
    dra = status["dra"]["gpu.example.com"]
    described = {n: d.get("basic", d) for n, d in pool.items()}
    if release.minor < SHAPE_SINCE:  # the devices alone, and said so
        assert len(slices) == 1 and "sharedCounters" not in slices[0]["spec"]
        assert all("consumesCounters" not in d for d in described.values())
        assert dra["dropped"] == [GATE]
        assert f"carry nothing that needs the feature gate {GATE}" in log
        return
    [counters] = [s["spec"] for s in slices if "sharedCounters" in s["spec"]]
    assert "devices" not in counters and counters["pool"]["resourceSliceCount"] == 2
    [counter_set] = counters["sharedCounters"]
    assert (counter_set["name"], quantities(counter_set["counters"])) == ("gpu-0", WHOLE)
    takes = {
        n: [(c["counterSet"], quantities(c["counters"])) for c in d["consumesCounters"]]
        for n, d in described.items()
    }
    assert takes == {"gpu-0": [("gpu-0", WHOLE)], "gpu-0-a": [("gpu-0", HALF)], "gpu-0-b": [("gpu-0", HALF)]}
    assert dra["dropped"] == [] and dra["slices"] == 2


@pytest.mark.parametrize("release", [control_plane.param(r) for r in control_plane.APISERVERS[:-1]])
async def test_with_the_alpha_gate_on_an_older_release_takes_its_own_shape(
    release: upstream.Release, folder: Path
) -> None:
    """--full-matrix: 1.33-1.35 with DRAPartitionableDevices on: devshim writes that release's
    shape, the set in the slice of the devices that consume it, and its validation takes it."""
    if release.minor >= SHAPE_SINCE:
        pytest.skip("1.36's shape: the test above")
    version = control_plane.NEWEST_DRA[release.minor]
    with control_plane.running(release, gates_on=[GATE]) as plane:
        published = Published(plane, version, "node-part")
        async with running(config(folder, plane, "node-part", SIM)) as devshim:
            pool = await published.until(lambda p: len(p) == 3, "the GPU and its halves")
            status = await devshim.status(
                lambda s: s["dra"]["gpu.example.com"]["generation"] >= 1, "published"
            )
            [only] = [s["spec"] for s in published.slices()]
    [counter_set] = only["sharedCounters"]
    assert (counter_set["name"], quantities(counter_set["counters"])) == ("gpu-0", WHOLE)
    described = {n: d.get("basic", d) for n, d in pool.items()}
    assert {n: [c["counterSet"] for c in d["consumesCounters"]] for n, d in described.items()} == {
        "gpu-0": ["gpu-0"], "gpu-0-a": ["gpu-0"], "gpu-0-b": ["gpu-0"]}  # fmt: skip
    assert status["dra"]["gpu.example.com"]["dropped"] == []

"""The simulated driver's own rules (adapters/sim): preference, grants, control-file commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adapters.sim.config import ResourceConfig
from adapters.sim.control import AppendedLines
from adapters.sim.resource import SimResource
from shim.sdk import UnknownDevice, types
from tests.support.driver_process import running_sim

NUMA = [
    {"id": "a", "numa_nodes": [0]},
    {"id": "b", "numa_nodes": [0]},
    {"id": "c", "numa_nodes": [1]},
    {"id": "d", "numa_nodes": [1]},
]


def resource(**config: Any) -> SimResource:
    return SimResource(ResourceConfig.model_validate({"name": "example.com/gpu", **config}))


@pytest.mark.parametrize(
    ("available", "must_include", "size", "chosen"),
    [
        (["a", "b", "c", "d"], ["c"], 2, ["c", "d"]),
        (["a", "b", "c", "d"], ["b"], 3, ["b", "a", "c"]),
        (["d", "c", "b", "a"], [], 2, ["d", "c"]),
        (["a", "b", "c"], ["c"], 2, ["c", "a"]),
    ],
    ids=["same-node-first", "then-the-rest", "no-must-include", "doc-example"],
)
def test_preference_keeps_to_the_numa_nodes_of_must_include(
    available: list[str], must_include: list[str], size: int, chosen: list[str]
) -> None:
    """must_include first, then devices sharing a NUMA node with them, then the rest, in the
    order given, cut to size (the rule the doc's preferred_allocation example shows)."""
    request = types.PreferenceRequest(available=available, must_include=must_include, size=size)
    assert resource(devices=NUMA).prefer(request) == chosen


def test_ids_default_to_the_short_name_and_a_dash() -> None:
    """count devices are named <short name>-<n> unless id_prefix says otherwise."""
    assert list(resource(count=2).devices) == ["gpu-0", "gpu-1"]
    assert list(resource(count=1, id_prefix="g").devices) == ["g0"]


def test_a_declared_resource_allocates_the_merge_of_its_declared_grants() -> None:
    """In declared mode allocate answers what devshim would merge from the listed grants, so
    both paths give a container the same thing."""
    sim = resource(count=2, grant_mode="declared", grant={"envs": {"G": "{ids}"}, "cdi_devices": ["x={id}"]})
    listed = [d.grant for d in sim.device_messages()]
    assert listed == [
        types.Grant(envs={"G": "gpu-0"}, cdi_devices=["x=gpu-0"]),
        types.Grant(envs={"G": "gpu-1"}, cdi_devices=["x=gpu-1"]),
    ]
    assert sim.grant(["gpu-0", "gpu-1"]) == types.Grant(
        envs={"G": "gpu-0,gpu-1"}, cdi_devices=["x=gpu-0", "x=gpu-1"]
    )
    with pytest.raises(UnknownDevice):
        sim.grant(["gpu-7"])


def test_resizing_keeps_the_first_devices_and_names_new_ones_by_the_lowest_free_number() -> None:
    """count N keeps health and topology of the devices it keeps."""
    sim = resource(devices=[{"id": "gpu-1", "numa_nodes": [1], "healthy": False}, {"id": "x"}])
    sim.resize(3)
    assert [(d.id, d.numa_nodes, d.health) for d in sim.devices.values()] == [
        ("gpu-1", (1,), types.Health.UNHEALTHY),
        ("x", (), types.Health.HEALTHY),
        ("gpu-0", (), types.Health.HEALTHY),
    ]
    sim.resize(1)
    assert list(sim.devices) == ["gpu-1"]


def test_the_control_file_is_read_for_complete_appended_lines_only(tmp_path: Path) -> None:
    """Lines there before following starts are skipped, a line is run once its newline is
    written, and a truncated file is read from the start again."""
    path = tmp_path / "control"
    path.write_text("count old 1\n")
    lines = AppendedLines(path)
    assert lines.read() == []
    with path.open("a") as f:
        f.write("remove a\nlog INFO half")
    assert lines.read() == ["remove a"]
    with path.open("a") as f:
        f.write(" a line\n")
    assert lines.read() == ["log INFO half a line"]
    path.write_text("add b 1\n")
    assert lines.read() == ["add b 1"]


async def test_control_commands_change_the_running_simulator(tmp_path: Path) -> None:
    """remove and count reach devshim as notifications; a malformed command is logged on stderr
    and skipped, and the simulator keeps going."""
    control = tmp_path / "control"
    control.touch()
    config = {
        "resources": [{"name": "example.com/gpu", "count": 1}, {"name": "example.com/nic", "count": 1}],
        "control_file": str(control),
    }
    async with running_sim(config, tmp_path) as sim:
        await sim.initialize()
        with control.open("a") as f:
            f.write(
                "frobnicate now\ncount example.com/gpu two\nremove example.com/nic\ncount example.com/gpu 2\n"
            )
        removed = await sim.wait_for(method="resources_changed")
        assert removed["params"] == {"resources": [{"name": "example.com/gpu"}]}
        grown = await sim.wait_for(method="devices_changed")
        assert [d["id"] for d in grown["params"]["devices"]] == ["gpu-0", "gpu-1"]
        gone = await sim.request(1, "list_devices", {"resource": "example.com/nic"})
        assert gone["error"]["code"] == -32003
        assert await sim.finish() == 0
    assert "frobnicate" in sim.stderr and "'two' is not a device count" in sim.stderr
    assert sim.unmatched == []


async def test_the_sdk_routes_an_admin_access_request_to_admin_access_and_refuses_the_rest(
    tmp_path: Path,
) -> None:
    """Protocol 1.3 through the Python SDK (the sim): an admin-access container goes to the
    driver's admin_access (the sim grants as allocate does), a resource without the flag answers
    -32601 as for any optional method it lacks, and a mix of admin and plain containers is
    malformed params."""
    grant = {"envs": {"SIM_DEVICES": "{ids}"}}
    config = {
        "resources": [
            {"name": "example.com/gpu", "count": 2, "grant": grant, "admin_access": True, "shares": True},
            {"name": "example.com/nic", "count": 1, "grant": grant},
        ]
    }
    async with running_sim(config, tmp_path) as sim:
        started = await sim.initialize("1.3.0")
        flags = {r["name"]: r.get("admin_access", False) for r in started["result"]["resources"]}
        assert flags == {"example.com/gpu": True, "example.com/nic": False}
        admin = {"device_ids": ["gpu-0"], "admin_access": True}
        answer = await sim.request(1, "allocate", {"resource": "example.com/gpu", "containers": [admin]})
        assert answer["result"] == {"containers": [{"envs": {"SIM_DEVICES": "gpu-0"}}]}
        refused = await sim.request(2, "allocate", {"resource": "example.com/nic", "containers": [
            {"device_ids": ["nic-0"], "admin_access": True}
        ]})  # fmt: skip
        assert refused["error"]["code"] == -32601
        mixed = await sim.request(3, "allocate", {"resource": "example.com/gpu", "containers": [
            admin, {"device_ids": ["gpu-1"]}
        ]})  # fmt: skip
        assert mixed["error"]["code"] == -32602 and "some containers but not all" in mixed["error"]["message"]
        share = {"device_id": "gpu-1", "share_id": "s-1", "consumed_capacity": {}}
        shared = await sim.request(4, "allocate", {"resource": "example.com/gpu", "containers": [
            {"device_ids": ["gpu-0"]}, {"device_ids": ["gpu-1"], "shares": [share]}
        ]})  # fmt: skip
        assert (
            shared["error"]["code"] == -32602 and "some containers but not all" in shared["error"]["message"]
        )
        alone = await sim.request(5, "allocate", {"resource": "example.com/gpu", "containers": [
            {"device_ids": ["gpu-1"], "shares": [share]}
        ]})  # fmt: skip
        assert alone["result"] == {"containers": [{"envs": {"SIM_DEVICES": "gpu-1"}}]}

"""The persisted inventory: what a restarted devshim knows about resources whose driver is down."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from shim.inventory import InventoryStore, SavedResource
from shim.model import (
    Attribute,
    AttributeKind,
    Capabilities,
    CapacityPolicy,
    CounterSet,
    Device,
    DeviceBinding,
    DeviceTaint,
    Health,
)

RESOURCE = "example.com/gpu"
SAVED = SavedResource(
    devices=(
        Device("gpu0", Health.HEALTHY, (0,)),
        Device("gpu1", Health.UNHEALTHY, (0, 1)),
        Device("gpu2"),
        Device(
            "gpu3",
            attributes=(
                ("cores", Attribute(AttributeKind.INT, 108)),
                ("model", Attribute(AttributeKind.STRING, "A")),
            ),
            capacity=(("memory", "80Gi"),),
        ),
        # Protocol 1.3 and 1.4's fields: a tainted partition of a shared GPU that needs attaching.
        Device(
            "gpu4",
            capacity=(("memory", "40Gi"),),
            taints=(DeviceTaint("gpu.example.com/ecc", "3", "NoExecute"),),
            counter_sets=(CounterSet("gpu-4", (("memory", "80Gi"),)),),
            consumes_counters=(CounterSet("gpu-4", (("memory", "40Gi"),)),),
            allow_multiple_allocations=True,
            capacity_policies=(("memory", CapacityPolicy("8Gi", valid_range=("4Gi", "16Gi", "4Gi"))),),
            binding=DeviceBinding(("gpu.example.com/attached",), ("gpu.example.com/failed",), True),
        ),
    ),
    in_use=(("gpu1", "gpu0"), ("gpu2",)),
)


@pytest.fixture
def messages() -> Iterator[list[str]]:
    captured: list[str] = []
    handler = logger.add(captured.append, level="WARNING", format="{level} {message}")
    yield captured
    logger.remove(handler)


def saved_json(store_dir: Path) -> dict[str, Any]:
    InventoryStore(store_dir).save(RESOURCE, SAVED)
    raw = json.loads((store_dir / "example.com_gpu.json").read_text())
    assert isinstance(raw, dict)
    return raw


def test_a_saved_inventory_loads_back_unchanged(tmp_path: Path) -> None:
    """Ids, health, NUMA nodes, every field DRA publishes (attributes, capacity, taints, counters,
    shares, binding), allocation groups and their order all survive a save and load: a restarted
    devshim whose driver is down publishes its devices as they were."""
    store = InventoryStore(tmp_path)
    store.save(RESOURCE, SAVED)
    assert store.load(RESOURCE) == SAVED


def test_the_drivers_declared_capabilities_are_kept_and_a_name_unknown_here_is_left_out(
    tmp_path: Path,
) -> None:
    """A restored resource registers with what its driver last declared (issue 42, item 1); a
    file from before the field, or naming a capability a newer devshim knows, still loads."""
    store = InventoryStore(tmp_path)
    declared = SavedResource(SAVED.devices, SAVED.in_use, Capabilities(pre_start=True, deallocate=True))
    store.save(RESOURCE, declared)
    assert store.load(RESOURCE) == declared
    path = next(tmp_path.glob("*.json"))
    raw = json.loads(path.read_text())
    assert raw["capabilities"] == ["pre_start", "deallocate"]
    path.write_text(json.dumps({**raw, "capabilities": ["pre_start", "teleport"]}))
    assert InventoryStore(tmp_path).load(RESOURCE) == SavedResource(
        SAVED.devices, SAVED.in_use, Capabilities(pre_start=True)
    )
    del raw["capabilities"]
    path.write_text(json.dumps(raw))
    assert InventoryStore(tmp_path).load(RESOURCE) == SAVED


def test_the_file_is_named_after_the_resource_and_holds_the_documented_fields(tmp_path: Path) -> None:
    """The on-disk format is the one documented: version 1, resource, devices, in_use, saved_at in UTC."""
    raw = saved_json(tmp_path)
    assert raw["version"] == 1
    assert raw["resource"] == RESOURCE
    assert raw["devices"] == [
        {"id": "gpu0", "health": "Healthy", "numa_nodes": [0]},
        {"id": "gpu1", "health": "Unhealthy", "numa_nodes": [0, 1]},
        {"id": "gpu2", "health": "Healthy", "numa_nodes": []},
        {
            "id": "gpu3",
            "health": "Healthy",
            "numa_nodes": [],
            "attributes": {"cores": {"int": 108}, "model": {"string": "A"}},
            "capacity": {"memory": "80Gi"},
        },
        {
            "id": "gpu4",
            "health": "Healthy",
            "numa_nodes": [],
            "capacity": {"memory": "40Gi"},
            "taints": [{"key": "gpu.example.com/ecc", "value": "3", "effect": "NoExecute"}],
            "counter_sets": [{"name": "gpu-4", "counters": {"memory": "80Gi"}}],
            "consumes_counters": [{"counter_set": "gpu-4", "counters": {"memory": "40Gi"}}],
            "allow_multiple_allocations": True,
            "capacity_policies": {
                "memory": {"default": "8Gi", "valid_range": {"min": "4Gi", "max": "16Gi", "step": "4Gi"}}
            },
            "binding": {
                "conditions": ["gpu.example.com/attached"],
                "failure_conditions": ["gpu.example.com/failed"],
                "binds_to_node": True,
            },
        },
    ]
    assert raw["in_use"] == [["gpu1", "gpu0"], ["gpu2"]]
    assert isinstance(raw["saved_at"], str) and raw["saved_at"].endswith("+00:00")


def test_a_later_save_replaces_the_earlier_one(tmp_path: Path) -> None:
    """Saving again overwrites: load returns the newest inventory, not a merge."""
    store = InventoryStore(tmp_path)
    store.save(RESOURCE, SAVED)
    newer = SavedResource(devices=(Device("gpu9"),), in_use=())
    store.save(RESOURCE, newer)
    assert store.load(RESOURCE) == newer


def test_loading_a_resource_never_saved_gives_none_without_a_warning(
    tmp_path: Path, messages: list[str]
) -> None:
    """A first start (no file, or no state directory yet) is normal, not worth a warning."""
    assert InventoryStore(tmp_path).load(RESOURCE) is None
    assert InventoryStore(tmp_path / "absent").load(RESOURCE) is None
    assert messages == []


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda raw: "{not json", "Expecting property name"),
        (lambda raw: json.dumps([raw]), "not a JSON object"),
        (lambda raw: json.dumps({**raw, "version": 2}), "unknown version 2"),
        (lambda raw: json.dumps({**raw, "version": True}), "'version' is bool"),
        (lambda raw: json.dumps({k: v for k, v in raw.items() if k != "in_use"}), "'in_use' missing"),
        (lambda raw: json.dumps({**raw, "resource": "example.com/fpga"}), "example.com/fpga"),
        (lambda raw: json.dumps({**raw, "devices": {"id": "gpu0"}}), "'devices' is dict"),
        (lambda raw: json.dumps({**raw, "devices": ["gpu0"]}), "devices[0]: not an object"),
        (
            lambda raw: json.dumps({**raw, "devices": [{"id": 3, "health": "Healthy", "numa_nodes": []}]}),
            "'id'",
        ),
        (
            lambda raw: json.dumps({**raw, "devices": [{"id": "a", "health": "ok", "numa_nodes": []}]}),
            "health 'ok'",
        ),
        (
            lambda raw: json.dumps(
                {**raw, "devices": [{"id": "a", "health": "Healthy", "numa_nodes": ["0"]}]}
            ),
            "numa_nodes",
        ),
        (
            lambda raw: json.dumps({**raw, "devices": [*raw["devices"], raw["devices"][0]]}),
            "duplicate device id 'gpu0'",
        ),
        (lambda raw: json.dumps({**raw, "in_use": [["gpu0", 1]]}), "in_use[0]"),
        (lambda raw: json.dumps({**raw, "saved_at": "yesterday"}), "saved_at 'yesterday'"),
    ],
    ids=[
        "corrupt-json",
        "not-an-object",
        "unknown-version",
        "bool-version",
        "missing-field",
        "other-resource",
        "devices-not-a-list",
        "device-not-an-object",
        "id-not-a-string",
        "invalid-health",
        "numa-not-integers",
        "duplicate-ids",
        "in-use-not-strings",
        "bad-saved-at",
    ],
)
def test_a_damaged_file_loads_as_none_with_one_warning_naming_the_file_and_why(
    tmp_path: Path, messages: list[str], change: Callable[[dict[str, Any]], str], why: str
) -> None:
    """Anything but a valid inventory for this very resource is ignored, never raised, and reported."""
    raw = saved_json(tmp_path)
    path = tmp_path / "example.com_gpu.json"
    path.write_text(change(raw))
    assert InventoryStore(tmp_path).load(RESOURCE) is None
    assert len(messages) == 1
    assert messages[0].startswith("WARNING")
    assert str(path) in messages[0]
    assert why in messages[0]


def test_an_unreadable_file_loads_as_none_with_a_warning(tmp_path: Path, messages: list[str]) -> None:
    """A file that is not UTF-8 (or cannot be read at all) is reported like a corrupt one."""
    path = tmp_path / "example.com_gpu.json"
    path.write_bytes(b"\xff\xfe{")
    assert InventoryStore(tmp_path).load(RESOURCE) is None
    assert len(messages) == 1 and str(path) in messages[0]


def test_save_leaves_only_the_final_file_behind(tmp_path: Path) -> None:
    """No temporary file survives a successful save, so nothing partial is ever listed or loaded."""
    store = InventoryStore(tmp_path)
    store.save(RESOURCE, SAVED)
    store.save("example.com/fpga", SAVED)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["example.com_fpga.json", "example.com_gpu.json"]


def test_a_save_failing_before_the_rename_keeps_the_previous_file_whole(
    tmp_path: Path, messages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save failing midway logs an error, removes its temp file and leaves the old inventory loadable."""
    store = InventoryStore(tmp_path)
    store.save(RESOURCE, SAVED)

    def failing_replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    store.save(RESOURCE, SavedResource(devices=(), in_use=()))
    monkeypatch.undo()

    assert store.load(RESOURCE) == SAVED
    assert [p.name for p in tmp_path.iterdir()] == ["example.com_gpu.json"]
    assert len(messages) == 1 and messages[0].startswith("ERROR") and "No space left" in messages[0]


def test_a_save_that_cannot_write_logs_an_error_instead_of_raising(
    tmp_path: Path, messages: list[str]
) -> None:
    """An unusable state directory (under a regular file: fails even as root) must not stop devshim."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    store = InventoryStore(blocker / "state")
    store.save(RESOURCE, SAVED)
    assert blocker.read_text() == "a file, not a directory"
    assert len(messages) == 1 and messages[0].startswith("ERROR")
    assert str(blocker / "state" / "example.com_gpu.json") in messages[0]


def test_save_creates_the_state_directory_private_to_devshim(tmp_path: Path) -> None:
    """A missing state directory (and its parents) is created with mode 0700, even under a stingy umask."""
    nested = tmp_path / "var" / "devshim"
    InventoryStore(nested).save(RESOURCE, SAVED)
    assert stat.S_IMODE(nested.stat().st_mode) == 0o700

    state_dir = tmp_path / "state"
    old_umask = os.umask(0o277)  # would leave the directory read-only to devshim itself
    try:
        InventoryStore(state_dir).save(RESOURCE, SAVED)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert InventoryStore(state_dir).load(RESOURCE) == SAVED


def test_forget_removes_the_saved_inventory_and_tolerates_none(tmp_path: Path) -> None:
    """After forget, load finds nothing; forgetting a resource never saved is not an error."""
    store = InventoryStore(tmp_path)
    store.save(RESOURCE, SAVED)
    store.forget(RESOURCE)
    assert store.load(RESOURCE) is None
    store.forget(RESOURCE)
    assert list(tmp_path.iterdir()) == []


def test_resources_lists_the_saved_names_and_skips_other_files(tmp_path: Path) -> None:
    """resources() turns file names back into resource names, sorted, ignoring temp and unrelated files."""
    store = InventoryStore(tmp_path)
    assert InventoryStore(tmp_path / "absent").resources() == []
    store.save("vendor.io/fpga_x", SAVED)
    store.save(RESOURCE, SAVED)
    store.save("example.com/nic", SAVED)
    store.forget("example.com/nic")
    (tmp_path / ".example.com_gpu.json.abc.tmp").write_text("{")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "no-slash.json").write_text("{}")
    assert store.resources() == [RESOURCE, "vendor.io/fpga_x"]


@pytest.mark.parametrize(
    "name",
    [
        "gpu",
        "example.com/",
        "/gpu",
        "a/b/c",
        "example.com/../gpu",
        "example_com/gpu",
        ".hidden/gpu",
        "a/b c",
        "",
    ],
)
def test_invalid_resource_names_are_refused(tmp_path: Path, name: str) -> None:
    """Names that are not domain/name, or could collide or escape the state directory, raise ValueError."""
    store = InventoryStore(tmp_path)
    with pytest.raises(ValueError, match="invalid resource name"):
        store.save(name, SAVED)
    with pytest.raises(ValueError, match="invalid resource name"):
        store.load(name)
    with pytest.raises(ValueError, match="invalid resource name"):
        store.forget(name)
    assert list(tmp_path.iterdir()) == []


def test_a_stale_background_save_finishing_after_the_final_one_does_not_overwrite_it(tmp_path: Path) -> None:
    """Shutdown's final save is the last word: a background save whose snapshot was taken earlier
    but whose thread ends later (it cannot be cancelled once writing) is dropped."""
    store = InventoryStore(tmp_path)
    earlier = SavedResource((Device("old", Health.HEALTHY),), ())
    final = SavedResource((Device("new", Health.HEALTHY),), (("new",),))
    background = store.stamp()  # the background save took its snapshot first...
    store.save("example.com/a", final, store.stamp())  # ...the final save wrote first
    store.save("example.com/a", earlier, background)  # ...and the background thread ends last
    assert store.load("example.com/a") == final
    store.save("example.com/a", earlier)  # a later snapshot is written as usual
    assert store.load("example.com/a") == earlier

"""The pure parts of DRA preparation: what a claim asks of a driver, the CDI spec of a grant, the
checkpoint's file. The CDI specs are also resolved by the CDI library itself, in the DRA-manager
judge (tests/compat/test_dra_manager.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from shim import cdi
from shim.dra.checkpoint import Checkpoint, Entry, Group, PreparedDevice, this_boot
from shim.dra.claims import Allocated, ClaimProblem, ClaimRef, allocated
from shim.model import ContainerGrant, DeviceNode, Mount
from tests.support.waiting import until

REF = ClaimRef("team-a", "gpus", "c-0001")


def claim(metadata: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    """A claim as the API server stores it, ``status`` fields replaced."""
    body: dict[str, Any] = {
        "metadata": {"name": "gpus", "namespace": "team-a", "uid": "c-0001"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "a", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"},
                        {"request": "b", "driver": "nic.example.com", "pool": "node-1", "device": "nic-0"},
                        {"request": "a", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-1"},
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "p-1"}],
        },
    }
    body["status"].update(status)
    if metadata is not None:
        body["metadata"] = metadata
    return body


def test_a_claim_gives_this_drivers_devices_in_order() -> None:
    assert allocated(claim(), REF, "gpu.example.com", "node-1") == [
        Allocated("a", "gpu-0"),
        Allocated("a", "gpu-1"),
    ]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (claim(metadata={"uid": "other"}), "deleted and created again"),
        (claim(allocation=None), "is not allocated"),
        (claim(reservedFor=[]), "reserved for no pod"),
        (claim(allocation={"devices": {"results": "x"}}), "is not a list"),
        (
            claim(allocation={"devices": {"results": [{"driver": "gpu.example.com", "pool": "node-1"}]}}),
            "without",
        ),
        (claim(allocation={"devices": {"results": []}}), "has no device of driver gpu.example.com"),
        ([], "deleted and created again"),  # not even an object
    ],
)
def test_a_claim_that_cannot_be_prepared_here_says_why(body: Any, said: str) -> None:
    with pytest.raises(ClaimProblem, match=said):
        allocated(body, REF, "gpu.example.com", "node-1")


def test_a_device_of_another_nodes_pool_is_refused() -> None:
    with pytest.raises(ClaimProblem, match="in pool 'node-1', not this node's \\('node-2'\\)"):
        allocated(claim(), REF, "gpu.example.com", "node-2")


GRANT = ContainerGrant(
    envs={"B": "2", "A": "1"},
    mounts=(Mount("/in", "/host/in", read_only=True), Mount("/rw", "/host/rw")),
    device_nodes=(DeviceNode("/dev/x", "/dev/x", "r"),),
    annotations={"ignored": "yes"},
    cdi_devices=("vendor.com/class=dev",),
)


def test_a_grant_becomes_container_edits_at_the_lowest_version() -> None:
    spec = cdi.spec("gpu.example.com", [cdi.CdiDevice("claim-1-0", GRANT)])
    assert spec == {
        "cdiVersion": "0.3.0",
        "kind": "gpu.example.com/claim",
        "devices": [
            {
                "name": "claim-1-0",
                "containerEdits": {
                    "env": ["A=1", "B=2"],
                    "deviceNodes": [{"path": "/dev/x", "permissions": "r"}],
                    "mounts": [
                        {
                            "hostPath": "/host/in",
                            "containerPath": "/in",
                            "options": ["rbind", "rprivate", "ro"],
                        },
                        {
                            "hostPath": "/host/rw",
                            "containerPath": "/rw",
                            "options": ["rbind", "rprivate", "rw"],
                        },
                    ],
                },
            }
        ],
    }


@pytest.mark.parametrize(
    ("name", "node", "version"),
    [
        ("a-0", DeviceNode("/dev/x", "/dev/x"), "0.3.0"),
        ("0a-0", DeviceNode("/dev/x", "/dev/x"), "0.5.0"),  # a name starting with a digit
        ("a-0", DeviceNode("/dev/x", "/dev/null"), "0.5.0"),  # hostPath
    ],
)
def test_the_version_rises_only_for_what_needs_it(name: str, node: DeviceNode, version: str) -> None:
    grant = ContainerGrant(device_nodes=(node,))
    assert cdi.spec("d.example.com", [cdi.CdiDevice(name, grant)])["cdiVersion"] == version


def test_a_grant_of_nothing_but_cdi_names_has_no_edits() -> None:
    assert not cdi.has_edits(ContainerGrant(cdi_devices=("v.com/c=x",), annotations={"a": "b"}))
    assert cdi.has_edits(ContainerGrant(envs={"A": "1"}))


def test_specs_are_written_whole_readable_by_the_runtime_and_removed(tmp_path: Path) -> None:
    specs = cdi.SpecDir(tmp_path / "cdi")
    assert not specs.has("gpu.example.com", "u-1")
    path = specs.write("gpu.example.com", "u-1", cdi.spec("gpu.example.com", [cdi.CdiDevice("u-1-0", GRANT)]))
    assert specs.has("gpu.example.com", "u-1")
    assert path == tmp_path / "cdi" / "devshim-gpu.example.com-u-1.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert json.loads(path.read_text())["kind"] == "gpu.example.com/claim"
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file left"
    specs.remove("gpu.example.com", "u-1")
    specs.remove("gpu.example.com", "u-1")  # gone already: fine
    assert not path.exists()


ENTRY = Entry(
    "team-a",
    "gpus",
    (Group("example.com/gpu", ("gpu-0", "gpu-1")),),
    (PreparedDevice(("a",), "node-1", "gpu-0", ("gpu.example.com/claim=c-0001-0",)),),
)


async def test_the_checkpoint_survives_a_restart(tmp_path: Path) -> None:
    first = Checkpoint(tmp_path, "gpu.example.com")
    await first.put("c-0001", ENTRY)
    await first.put("c-0002", Entry("team-b", "half", ENTRY.groups, None))
    again = Checkpoint(tmp_path, "gpu.example.com")
    assert dict(again) == {"c-0001": ENTRY, "c-0002": Entry("team-b", "half", ENTRY.groups, None)}
    assert again.get("c-0002") is not None and not again.get("c-0002").prepared  # type: ignore[union-attr]
    await again.drop("c-0001")
    assert [uid for uid, _ in Checkpoint(tmp_path, "gpu.example.com")] == ["c-0002"]
    assert stat.S_IMODE(again.path.stat().st_mode) == 0o600


async def test_the_boot_and_the_spec_of_a_claim_are_kept_and_an_older_file_is_of_this_boot(
    tmp_path: Path,
) -> None:
    """A file without boot IDs (an older devshim's) reads as before: every claim of this boot."""
    spec = cdi.spec("gpu.example.com", [cdi.CdiDevice("c-0001-0", GRANT)])
    kept = dataclasses.replace(ENTRY, boot_id="b-1", cdi_spec=spec)
    first = Checkpoint(tmp_path, "gpu.example.com")
    await first.put("c-0001", kept)
    await first.put("c-0002", ENTRY)
    body = json.loads(first.path.read_text())
    assert "boot_id" not in body["claims"]["c-0002"], "unset fields are not written"
    again = Checkpoint(tmp_path, "gpu.example.com")
    assert dict(again) == {"c-0001": kept, "c-0002": ENTRY}
    again.boot_id = "b-2"
    assert not again.of_this_boot(kept) and again.of_this_boot(ENTRY)
    again.boot_id = None  # unreadable: nothing can be told apart
    assert again.of_this_boot(kept)


@pytest.mark.parametrize("field", ['"boot_id": 7', '"cdi_spec": "x"'])
async def test_a_claim_with_a_boot_or_spec_of_the_wrong_type_sets_the_checkpoint_aside(
    tmp_path: Path, field: str
) -> None:
    path = tmp_path / "dra" / "gpu.example.com.json"
    path.parent.mkdir()
    claim = '{"namespace": "a", "name": "b", "groups": [], "devices": null, ' + field + "}"
    path.write_text('{"format": 1, "driver": "gpu.example.com", "claims": {"u": ' + claim + "}}")
    assert list(Checkpoint(tmp_path, "gpu.example.com")) == []
    assert path.with_suffix(".unreadable").exists()


def test_the_boot_id_is_the_kernels_and_none_where_it_cannot_be_read(tmp_path: Path) -> None:
    assert this_boot() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert this_boot(tmp_path / "missing") is None
    (tmp_path / "empty").write_text("\n")
    assert this_boot(tmp_path / "empty") is None


@pytest.mark.parametrize(
    "text", ["{", '{"format": 2, "driver": "gpu.example.com", "claims": {}}', '{"format": 1}', "[]"]
)
async def test_an_unreadable_checkpoint_is_kept_aside_and_said(tmp_path: Path, text: str) -> None:
    path = tmp_path / "dra" / "gpu.example.com.json"
    path.parent.mkdir()
    path.write_text(text)
    checkpoint = Checkpoint(tmp_path, "gpu.example.com")
    assert list(checkpoint) == []
    assert path.with_suffix(".unreadable").read_text() == text
    await checkpoint.put("c-0001", ENTRY)
    assert os.path.exists(path)


@pytest.mark.parametrize(
    ("ref", "said"),
    [
        (ClaimRef("team-a", "gpus", "c-0001"), None),
        (ClaimRef("team-a", "gpus.v2", "0c8e4f7a-2b1d-4e8e-9a57-6f1d2b0c9e11"), None),
        (ClaimRef("../etc", "gpus", "u"), "is not a namespace"),
        (ClaimRef("team-a", "gpus/../../x", "u"), "is not a ResourceClaim name"),
        (ClaimRef("team-a", "g" * 254, "u"), "is not a ResourceClaim name"),
        (ClaimRef("team-a", "gpus", "../../etc/passwd"), "is not a uid"),
        (ClaimRef("team-a", "gpus", ""), "is not a uid"),
    ],
)
def test_what_the_kubelet_names_a_claim_by_is_checked_before_any_use(ref: ClaimRef, said: str | None) -> None:
    """The namespace and name become an API path, the uid a file name and a CDI device name."""
    problem = ref.problem()
    assert problem is None if said is None else said in str(problem)


class _Counted(Checkpoint):
    """The checkpoint, noting each file write and the thread it ran on."""

    def __init__(self, state_dir: Path, driver: str) -> None:
        super().__init__(state_dir, driver)
        self.writes: list[int] = []
        self.synced: list[bool] = []

    def _write(self, body: bytes, synced: bool) -> None:
        self.writes.append(threading.get_ident())
        self.synced.append(synced)
        super()._write(body, synced)


async def test_changes_made_at_once_all_reach_the_file_written_off_the_loop_and_fewer_times(
    tmp_path: Path,
) -> None:
    """Many claims prepared together: each change is in the file once its put returns, the
    synced write runs on a thread (the loop serves meanwhile), writes run one at a time and
    changes made during one are written together by the next, so the file never goes back."""
    checkpoint = _Counted(tmp_path, "gpu.example.com")
    uids = [f"c-{n:04}" for n in range(40)]

    async def churn(uid: str, keep: bool) -> None:
        await checkpoint.put(uid, Entry("ns", uid, ENTRY.groups, None))
        assert dict(Checkpoint(tmp_path, "gpu.example.com"))[uid].name == uid  # durable on return
        await checkpoint.put(uid, ENTRY)
        if not keep:
            await checkpoint.drop(uid)

    await asyncio.gather(*(churn(uid, keep=n % 2 == 0) for n, uid in enumerate(uids)))
    assert dict(Checkpoint(tmp_path, "gpu.example.com")) == {uid: ENTRY for uid in uids[::2]}
    assert threading.get_ident() not in checkpoint.writes
    assert len(checkpoint.writes) < 100  # 100 changes, written in fewer saves


async def test_a_change_synced_at_boot_is_written_on_the_loop_and_never_stands_for_a_synced_one(
    tmp_path: Path,
) -> None:
    """A claim preparing is written unsynced (only this boot reads it back), at once, on the
    loop; a synced put after or beside it is synced whatever unsynced write came first."""
    checkpoint = _Counted(tmp_path, "gpu.example.com")
    preparing = Entry("ns", "a", ENTRY.groups, None)
    await checkpoint.put("c-0001", preparing, sync="boot")
    assert (checkpoint.writes, checkpoint.synced) == ([threading.get_ident()], [False])
    assert dict(Checkpoint(tmp_path, "gpu.example.com")) == {"c-0001": preparing}
    # The unsynced save waits behind a synced one and writes the synced put after it too: that
    # put still waits for a synced write of its own.
    await asyncio.gather(
        checkpoint.put("c-0003", preparing),
        checkpoint.put("c-0002", preparing, sync="boot"),
        checkpoint.put("c-0001", ENTRY),
    )
    assert checkpoint.synced == [False, True, False, True]
    assert checkpoint.writes[-1] != threading.get_ident()
    assert dict(Checkpoint(tmp_path, "gpu.example.com")) == {
        "c-0001": ENTRY, "c-0002": preparing, "c-0003": preparing
    }  # fmt: skip


async def test_a_change_synced_soon_is_in_the_file_at_once_and_on_disk_right_after(tmp_path: Path) -> None:
    """A claim prepared: in the file when put returns (unsynced), then synced in the background
    without being asked; ``flush`` waits for it; many at once share the syncs."""
    checkpoint = _Counted(tmp_path, "gpu.example.com")
    await checkpoint.put("c-0001", ENTRY, sync="soon")
    assert checkpoint.synced == [False]
    assert dict(Checkpoint(tmp_path, "gpu.example.com")) == {"c-0001": ENTRY}
    await until(lambda: checkpoint.synced == [False, True], "the background sync")
    await asyncio.gather(*(checkpoint.put(f"c-{n:04}", ENTRY, sync="soon") for n in range(2, 30)))
    await checkpoint.flush()
    assert checkpoint.synced[-1] is True
    assert checkpoint.synced.count(True) < 29
    assert len(dict(Checkpoint(tmp_path, "gpu.example.com"))) == 29
    written = len(checkpoint.writes)
    await checkpoint.flush()  # nothing new: no write
    assert len(checkpoint.writes) == written

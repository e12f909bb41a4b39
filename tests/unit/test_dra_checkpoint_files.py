"""The DRA prepared-claims checkpoint replaced by something devshim did not write: JSON nested
past the parser's depth, a FIFO, a link to /dev/zero, a link at all, a directory, a file over the
bound. Each is refused at once with its reason, set aside for a person to read, and the driver
starts with no claims, as with a corrupt checkpoint (docs/reliability.md, "Attacks")."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from loguru import logger

from shim.dra.checkpoint import MAX_BYTES, Checkpoint, Entry, Group, PreparedDevice

DRIVER = "gpu.example.com"
ENTRY = Entry(
    "team-a",
    "gpus",
    (Group("example.com/gpu", ("gpu-0",)),),
    (PreparedDevice(("a",), "node-1", "gpu-0", ("gpu.example.com/claim=c-0001-0",)),),
)


@pytest.fixture
def errors() -> Iterator[list[str]]:
    captured: list[str] = []
    handler = logger.add(captured.append, level="WARNING", format="{level} {message}")
    yield captured
    logger.remove(handler)


def _deep(path: Path, valid: Path) -> None:
    path.write_bytes(b'{"format": 1, "claims": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def _fifo(path: Path, valid: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path, valid: Path) -> None:
    path.symlink_to("/dev/zero")


def _link(path: Path, valid: Path) -> None:
    path.symlink_to(valid)  # a link devshim did not write could point anywhere later


def _folder(path: Path, valid: Path) -> None:
    path.mkdir()


def _huge(path: Path, valid: Path) -> None:
    with path.open("wb") as huge:
        huge.truncate(MAX_BYTES + 1)  # sparse: costs no disk


REPLACEMENTS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "JSON 100k deep": (_deep, "nested too deeply"),
    "a FIFO": (_fifo, "not a regular file"),
    "a link to /dev/zero": (_zero, "symbolic link"),
    "a link to a valid checkpoint": (_link, "symbolic link"),
    "a directory": (_folder, "not a regular file"),
    "a file over the bound": (_huge, f"larger than {MAX_BYTES} bytes"),
}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("replacement", REPLACEMENTS.values(), ids=list(REPLACEMENTS))
def test_a_checkpoint_that_is_not_a_plain_file_devshim_wrote_is_set_aside_and_devshim_starts_without_it(
    replacement: tuple[Callable[[Path, Path], None], str], tmp_path: Path, errors: list[str]
) -> None:
    """Reading the checkpoint at start never blocks (FIFO), never reads without end (/dev/zero),
    never crashes (RecursionError) and never follows a link: the driver starts with no claims, one
    error names the file and why, the thing is kept aside, and the next change writes a plain file."""
    make, why = replacement
    state = tmp_path / "state"
    asyncio.run(Checkpoint(state, DRIVER).put("c-0001", ENTRY))
    path = state / "dra" / f"{DRIVER}.json"
    valid = tmp_path / "valid.json"
    path.rename(valid)
    make(path, valid)

    checkpoint = Checkpoint(state, DRIVER)

    assert list(checkpoint) == []
    assert len(errors) == 1, errors
    assert errors[0].startswith("ERROR") and str(path) in errors[0] and why in errors[0]
    assert f"moved to {path.with_suffix('.unreadable')}" in errors[0]
    assert os.path.lexists(path.with_suffix(".unreadable")) and not os.path.lexists(path)
    asyncio.run(checkpoint.put("c-0002", ENTRY))
    assert stat.S_ISREG(os.lstat(path).st_mode)
    assert dict(Checkpoint(state, DRIVER)) == {"c-0002": ENTRY}


@pytest.mark.timeout(10)
def test_a_checkpoint_that_cannot_be_set_aside_is_still_ignored_with_the_reason(
    tmp_path: Path, errors: list[str]
) -> None:
    """Where the unreadable file cannot be moved (a folder in the way), devshim still starts, and
    the error says the file was not kept."""
    path = tmp_path / "dra" / f"{DRIVER}.json"
    path.parent.mkdir()
    os.mkfifo(path)
    (path.with_suffix(".unreadable") / "in-the-way").mkdir(parents=True)

    assert list(Checkpoint(tmp_path, DRIVER)) == []
    assert len(errors) == 1 and "not a regular file" in errors[0] and "could not be moved" in errors[0]

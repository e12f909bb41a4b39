"""Files devshim reads that are not what they should be: a settings file that is not UTF-8,
nested past the parser's depth, a FIFO, a device, huge; a saved inventory replaced by a FIFO, a
link to /dev/zero or a link at all. Each is refused at once with its reason, never read forever
(docs/reliability.md, "Attacks")."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from shim.configfile import CONFIG_FILE_LIMIT, ConfigError, read_config_file
from shim.inventory import InventoryStore, SavedResource, _file_name
from shim.model import Device, Health

BAD_SETTINGS = {
    "latin-1": (b"log_level: \xe9\n", "is not UTF-8"),
    "a list 100k deep": (b"resources: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
    "mappings 2k deep": ("".join(" " * i + "a:\n" for i in range(2000)).encode(), "nested too deeply"),
}


@pytest.mark.parametrize("content", BAD_SETTINGS.values(), ids=list(BAD_SETTINGS))
def test_an_unparseable_settings_file_is_a_config_error(content: tuple[bytes, str], tmp_path: Path) -> None:
    path = tmp_path / "devshim.yaml"
    path.write_bytes(content[0])
    with pytest.raises(ConfigError, match=content[1]):
        read_config_file(path)


@pytest.mark.timeout(10)
def test_a_settings_file_that_is_a_fifo_a_device_or_huge_is_refused_unread(tmp_path: Path) -> None:
    """A FIFO would block the reader until someone writes; /dev/zero never ends."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    with (tmp_path / "huge").open("wb") as huge:
        huge.truncate(CONFIG_FILE_LIMIT + 1)  # sparse: costs no disk
    refusals = {"fifo": "not a regular file", "zero": "not a regular file", "huge": "larger than"}
    for name, why in refusals.items():
        with pytest.raises(ConfigError, match=f"cannot read config file {tmp_path / name}: it is {why}"):
            read_config_file(tmp_path / name)


def test_a_settings_file_behind_a_link_is_read(tmp_path: Path) -> None:
    """ConfigMaps are mounted as links: a link to a regular file is fine for settings."""
    (tmp_path / "real.yaml").write_text("log_level: DEBUG\n")
    (tmp_path / "devshim.yaml").symlink_to(tmp_path / "real.yaml")
    assert read_config_file(tmp_path / "devshim.yaml") == {"log_level": "DEBUG"}


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    seen: list[str] = []
    handler = logger.add(lambda message: seen.append(str(message)), level="WARNING")
    yield seen
    logger.remove(handler)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("replacement", ["fifo", "link to /dev/zero", "link to a valid file", "not UTF-8"])
def test_a_saved_inventory_that_is_not_a_plain_file_devshim_wrote_is_ignored(
    replacement: str, tmp_path: Path, warnings: list[str]
) -> None:
    store = InventoryStore(tmp_path / "state")
    good = SavedResource((Device("d0", Health.HEALTHY),), ())
    store.save("example.com/a", good)
    assert store.load("example.com/a") == good
    path = tmp_path / "state" / _file_name("example.com/a")
    valid = tmp_path / "valid.json"
    path.rename(valid)
    if replacement == "fifo":
        os.mkfifo(path)
    elif replacement == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    elif replacement == "link to a valid file":
        path.symlink_to(valid)  # a link devshim did not write could point anywhere later
    else:
        path.write_bytes(json.dumps(json.loads(valid.read_text())).encode().replace(b"d0", b"d\xe9"))
    assert store.load("example.com/a") is None
    assert any("starting example.com/a without it" in line for line in warnings), warnings

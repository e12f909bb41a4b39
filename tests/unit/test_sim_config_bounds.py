"""The simulator's configuration is read within bounds (adapters/sim/config.py): a file or an
inline JSON string over the size cap, a FIFO or a directory in the file's place, a document
nested past the parser's depth: each is the adapter's ConfigError, at once, naming the bound."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from adapters.sim.config import INLINE_JSON_LIMIT, ConfigError, SimConfig, load_config
from shim.configfile import CONFIG_FILE_LIMIT

# Far longer than a refusal takes; short enough that a reader blocked on a FIFO fails the test.
PROMPTLY_S = 5.0

DEEP_LIST = "[" * 100_000 + "]" * 100_000


def load_in_thread(path: Path) -> BaseException | SimConfig:
    """What load_config(path) raised or returned, or a test failure if it blocks.

    In a thread so that a reader blocked on a FIFO fails the test instead of hanging it."""
    outcome: list[BaseException | SimConfig] = []

    def load() -> None:
        try:
            outcome.append(load_config(path))
        except BaseException as exc:  # handed to the test to judge
            outcome.append(exc)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(PROMPTLY_S)
    if reader.is_alive():
        if path.is_fifo():
            # A writer that opens and closes gives the blocked reader EOF, so the thread ends.
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"load_config({path}) still blocked after {PROMPTLY_S} s")
    return outcome[0]


def test_a_config_file_over_the_cap_is_refused_naming_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "sim.yaml"
    # Valid YAML (an empty mapping, then blank lines): only its size is wrong.
    path.write_bytes(b"{}\n" + b"\n" * CONFIG_FILE_LIMIT)
    with pytest.raises(ConfigError) as no:
        load_config(path)
    assert str(no.value) == f"cannot read config file {path}: it is larger than {CONFIG_FILE_LIMIT} bytes"


def test_inline_json_over_the_cap_is_refused_naming_the_cap() -> None:
    text = "{}" + " " * INLINE_JSON_LIMIT  # valid JSON: only its size is wrong
    with pytest.raises(ConfigError) as no:
        load_config(inline_json=text)
    assert str(no.value) == f"cannot read --config-json: it is longer than {INLINE_JSON_LIMIT} characters"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_config_path_that_is_not_a_regular_file_is_refused_promptly(kind: str, tmp_path: Path) -> None:
    """A FIFO with no writer would block a plain read until someone writes, a start-up forever."""
    path = tmp_path / "sim.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    outcome = load_in_thread(path)
    assert isinstance(outcome, ConfigError), repr(outcome)
    assert str(outcome) == f"cannot read config file {path}: it is not a regular file"


def test_a_config_file_nested_too_deeply_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "sim.yaml"
    path.write_text(f"resources: {DEEP_LIST}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as no:
        load_config(path)
    assert str(no.value) == f"config file {path} is nested too deeply to parse"


def test_inline_json_nested_too_deeply_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--config-json is nested too deeply to parse"):
        load_config(inline_json=f'{{"resources": {DEEP_LIST}}}')


def test_a_normal_config_still_loads_from_a_file_and_inline(tmp_path: Path) -> None:
    config = {"resources": [{"name": "example.com/gpu", "count": 2}]}
    path = tmp_path / "sim.yaml"
    path.write_text("resources:\n  - name: example.com/gpu\n    count: 2\n", encoding="utf-8")
    for loaded in (load_config(path), load_config(inline_json=json.dumps(config))):
        (resource,) = loaded.resources
        assert [d.id for d in resource.initial_devices()] == ["gpu-0", "gpu-1"]
    assert load_config(inline_json=None) == SimConfig()  # neither given: no resources yet

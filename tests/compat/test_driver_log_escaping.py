"""A driver's stderr and `log` notifications cannot split, forge or reverse devshim's log lines
with Unicode: NEL, LINE and PARAGRAPH SEPARATOR (new lines to a log viewer) and the bidi controls
(which reverse what follows them) reach the log escaped, as the C0 controls always did
(docs/reliability.md, "Attacks").

The driver is tests/support/drivers/unicode_lines.py, a real subprocess of devshim.
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from loguru import logger

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.settings import Settings
from tests.support.drivers import unicode_lines
from tests.support.drivers.unicode_lines import FORGED, RESOURCE
from tests.support.waiting import until

WAIT_S = 20.0
HIDDEN = {"Cc", "Cf", "Zl", "Zp"}
# How the forgery must read in devshim's log: every such character escaped, the rest as written.
SHOWN = (
    "{where} says\\x85" + FORGED + "\\u2028" + FORGED + "\\u2029" + FORGED + " "
    "\\u202aword \\u202bword \\u202cword \\u202dword \\u202eword \\u2066word \\u2067word "
    "\\u2068word \\u2069word \\u200eword \\u200fword \\u061cword \\U000e0041tag"
)


@pytest.fixture
def driver_lines() -> Iterator[list[tuple[str, str]]]:
    """(level, message) of what devshim logged for the driver."""
    entries: list[tuple[str, str]] = []

    def sink(message: Any) -> None:
        text = message.record["message"]
        if text.startswith("driver 'lines': "):
            entries.append((message.record["level"].name, text))

    sink_id = logger.add(sink, level="INFO")
    try:
        yield entries
    finally:
        logger.remove(sink_id)


async def test_a_driver_cannot_split_forge_or_reverse_log_lines_with_unicode_separators_and_bidi_controls(
    plugin_dir: Path, state_dir: Path, driver_lines: list[tuple[str, str]]
) -> None:
    """The driver writes one stderr line and sends one `log` notification, each holding NEL,
    U+2028 and U+2029 before a devshim-like ERROR line, and every bidi control: each is logged
    as one line with all of them escaped, and no log line of devshim's holds any of them."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        drivers=[
            {
                "name": "lines",
                "user": "root",
                "command": [sys.executable, unicode_lines.__file__],
                "resources": [RESOURCE],
            }
        ],
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings):
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=WAIT_S)
        assert [d.id for d in await session.wait_for_list(timeout=WAIT_S)] == ["line-0"]
        wanted = {("INFO", SHOWN.format(where="stderr")), ("ERROR", SHOWN.format(where="log"))}

        def logged() -> set[tuple[str, str]]:
            return {(level, m.removeprefix("driver 'lines': ")) for level, m in driver_lines}

        await until(lambda: wanted <= logged(), "both forgeries are logged, escaped", timeout=WAIT_S)
    for _, message in driver_lines:
        assert not {unicodedata.category(c) for c in message} & HIDDEN, ascii(message)
    assert not any(m.startswith(FORGED) for _, m in driver_lines)


@pytest.fixture
def every_line() -> Iterator[list[str]]:
    """Every message devshim logged during the test, whoever logged it."""
    entries: list[str] = []
    sink_id = logger.add(lambda message: entries.append(message.record["message"]), level="DEBUG")
    try:
        yield entries
    finally:
        logger.remove(sink_id)


async def test_a_driver_cannot_forge_log_lines_with_the_message_of_an_error_it_answers(
    plugin_dir: Path, state_dir: Path, every_line: list[str]
) -> None:
    """The driver fails Allocate with an error message holding a newline, U+2028, U+2029 and the
    bidi controls before devshim-like ERROR lines: the kubelet's error and devshim's log show the
    message escaped, one line, and no line devshim logs holds any such character."""
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=state_dir,
        register_backoff_max_s=0.5,
        drivers=[
            {
                "name": "lines",
                "user": "root",
                "command": [sys.executable, unicode_lines.__file__],
                "resources": [RESOURCE],
            }
        ],
    )
    async with FakeKubelet(plugin_dir) as kubelet, Shim(settings):
        session = await kubelet.wait_for_plugin(RESOURCE, timeout=WAIT_S)
        await session.wait_for_list(timeout=WAIT_S)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await session.allocate(["line-0"])
    shown = SHOWN.format(where="error").replace("says\\x85", "says\\x0a", 1)
    assert failed.value.details() == f"driver 'lines': allocate: {shown} (JSON-RPC error -32000)"
    assert any(shown in m for m in every_line)
    for message in every_line:
        assert not {unicodedata.category(c) for c in message} & HIDDEN, ascii(message)

"""crash_twice_in_a_second (the plugin row `crash_restart`): two starts within one second, or a
skip that says the condition could not be made; never a pass without it."""

from __future__ import annotations

import asyncio
import time

import pytest

from shim.compat import plugin_process
from shim.compat.results import Skip


async def test_the_second_start_falls_within_the_second_of_the_first() -> None:
    starts: list[float] = []

    async def restart() -> None:
        starts.append(time.time())

    async def came_up() -> None:
        pass

    await plugin_process.crash_twice_in_a_second(restart, came_up)
    assert len(starts) == 2 and int(starts[0]) == int(starts[1])


async def test_a_plugin_slower_than_a_second_to_come_up_skips_the_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plugin_process, "SAME_SECOND_TRIES", 2)
    starts: list[float] = []

    async def restart() -> None:
        starts.append(time.time())

    async def came_up() -> None:
        await asyncio.sleep(1.0)  # from a second's start: always into the next one

    with pytest.raises(Skip, match="took over a second to come up after each of 2 restarts"):
        await plugin_process.crash_twice_in_a_second(restart, came_up)
    assert len(starts) == 2, "one start per try, and no second start outside the second"

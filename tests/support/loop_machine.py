"""A hypothesis state machine that drives one background task of devshim's on an event loop of
its own: the events are rules, ``runs_a_while`` lets the task work for a number of loop turns in
between (so an event can land mid-write), and ``settles`` (a subclass's) is checked at the end
(tests/unit/test_dra_publisher_stateful.py, tests/unit/test_dra_binding_stateful.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Coroutine
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule


class LoopMachine(RuleBasedStateMachine):
    task: asyncio.Task[None]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coroutine)

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        self.task = self.loop.create_task(work)

    def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            self.run(self.task)

    def settles(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        try:
            self.settles()
        finally:
            self.stop()
            self.loop.close()

    @rule(turns=st.integers(1, 40))
    def runs_a_while(self, turns: int) -> None:
        async def turns_of_the_loop() -> None:
            for _ in range(turns):
                await asyncio.sleep(0)

        self.run(turns_of_the_loop())

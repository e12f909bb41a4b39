"""shim/slices.py: long works hand the loop back one slice a turn, works of a kind take turns, kinds
interleave, other ready work goes first, and what long works make skips the young collections."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shim import slices as slices_module
from shim.slices import JOIN_RUN, joined, sliced


async def _work(kind: str, name: str, steps: int, order: list[str]) -> None:
    async with sliced(kind, slice_s=0) as slices:  # every step ends a slice
        for _ in range(steps):
            order.append(name)
            await slices.due()


def test_works_of_one_kind_take_turns_and_kinds_interleave() -> None:
    async def main() -> list[str]:
        order: list[str] = []
        await asyncio.gather(
            _work("saves", "a", 3, order), _work("saves", "b", 3, order), _work("lists", "c", 3, order)
        )
        return order

    order = asyncio.run(main())
    saves = [name for name in order if name != "c"]
    assert saves == ["a"] * 3 + ["b"] * 3  # b waited for a's whole work
    assert order.index("c") < order.index("b")  # c did not wait for either


def test_a_long_work_hands_the_loop_back_between_slices() -> None:
    async def main() -> int:
        turns = 0
        work = asyncio.create_task(_work("saves", "a", 50, []))
        while not work.done():
            turns += 1
            await asyncio.sleep(0)
        return turns

    assert asyncio.run(main()) >= 50


@given(st.lists(st.text(max_size=3), max_size=3 * JOIN_RUN), st.sampled_from(["", ", "]))
def test_joined_is_join(items: list[str], separator: str) -> None:
    async def main() -> str:
        return await joined(separator, items, "joins")

    assert asyncio.run(main()) == separator.join(items)


def test_joined_joins_runs_of_a_long_list_in_order() -> None:
    items = [str(i) for i in range(2 * JOIN_RUN + 5)]

    async def main() -> str:
        return await joined(",", items, "joins")

    assert asyncio.run(main()) == ",".join(items)


def test_one_slice_runs_in_a_turn_of_the_loop_whatever_its_kind() -> None:
    """Two long works of different kinds: between two slices of one, a turn of the loop ran
    (another handle could), and no turn ran a slice of each."""

    async def main() -> list[tuple[str, int]]:
        turns = 0
        steps: list[tuple[str, int]] = []

        async def count_turns() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        async def work(kind: str) -> None:
            async with sliced(kind, slice_s=0) as slices:
                for _ in range(20):
                    steps.append((kind, turns))
                    await slices.due()

        counter = asyncio.create_task(count_turns())
        await asyncio.gather(work("reads"), work("saves"))
        counter.cancel()
        return steps

    steps = asyncio.run(main())
    kinds = [kind for kind, _ in steps]
    assert kinds.count("reads") == kinds.count("saves") == 20
    assert "saves" in kinds[: kinds.index("reads") + 3]  # round robin, not one work after the other
    turn_of = [turn for _, turn in steps]
    assert len(set(turn_of)) == len(turn_of)  # never two slices in one turn


def test_a_long_work_cancelled_while_waiting_leaves_the_baton_to_the_others() -> None:
    async def main() -> list[str]:
        order: list[str] = []
        first = asyncio.create_task(_work("a", "first", 5, order))
        waiting = asyncio.create_task(_work("b", "cancelled", 5, order))
        last = asyncio.create_task(_work("c", "last", 5, order))
        await asyncio.sleep(0)
        waiting.cancel()
        async with asyncio.timeout(10):
            await asyncio.gather(first, last)
        return order

    order = asyncio.run(main())
    assert order.count("first") == order.count("last") == 5


def test_between_slices_other_ready_work_runs_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of steps that each do some work (an Allocate's handles) runs to its end before
    the long work's next slice: the long work yields until a turn of the loop finds nothing."""
    monkeypatch.setattr(slices_module, "YIELD_S", 60.0)  # on a busy machine too: no cap

    async def main() -> list[str]:
        order: list[str] = []

        async def chain() -> None:
            for _ in range(5):
                order.append("step")
                busy_until = time.perf_counter() + 10 * slices_module.EMPTY_TURN_S
                while time.perf_counter() < busy_until:
                    pass
                await asyncio.sleep(0)

        async def long_work() -> None:
            async with sliced("reads", slice_s=0) as slices:
                for _ in range(3):
                    order.append("slice")
                    await slices.due()

        await asyncio.gather(chain(), long_work())
        return order

    order = asyncio.run(main())
    first = order.index("slice")
    assert order[first + 1 : order.index("slice", first + 1)] == ["step"] * (5 - first), order


def test_what_a_long_work_made_goes_to_the_oldest_generation() -> None:
    async def main() -> list[object]:
        async with sliced("reads") as _:
            return [object() for _ in range(3)]  # a list: tracked by the collector

    made = asyncio.run(main())
    assert not any(obj is made for obj in gc.get_objects(generation=0))
    assert not any(obj is made for obj in gc.get_objects(generation=1))
    assert any(obj is made for obj in gc.get_objects(generation=2))


def test_garbage_moved_with_it_is_collected_at_the_next_full_collection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Node:
        other: Node

    monkeypatch.setattr(slices_module, "FULL_COLLECTION_S", 0.0)

    def garbage() -> weakref.ref[Node]:
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        return weakref.ref(a)

    async def main() -> weakref.ref[Node]:
        async with sliced("reads") as _:
            return garbage()

    gone = asyncio.run(main())
    assert gone() is None

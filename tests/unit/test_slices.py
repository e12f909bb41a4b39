"""shim/slices.py: long works hand the loop back, works of a kind take turns, kinds interleave."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

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

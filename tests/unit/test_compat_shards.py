"""The shards' cut (shim/compat/shards.py), searched: every cell in exactly one shard, the same
cut whatever order the cells come in, and a balance within one cell's cost of the even share
(longest-processing-time-first's bound is tighter; this is the one every greedy cut keeps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shim.compat import shards
from shim.compat.shards import Shard, ShardError, assign

cells_st = st.lists(
    st.tuples(st.sampled_from("abcdefgh"), st.sampled_from(["x/1", "x/2", "y/1"])), unique=True
)


@given(cells=cells_st, count=st.integers(1, 6), data=st.data())
def test_every_cell_in_one_shard_the_same_whatever_the_order(
    cells: list[tuple[str, str]], count: int, data: st.DataObject
) -> None:
    costs = {c: data.draw(st.floats(0.01, 100)) for c in cells if data.draw(st.booleans())}
    cut = assign(cells, count, costs)
    assert set(cut) == set(cells) and set(cut.values()) <= set(range(1, count + 1))
    assert assign(data.draw(st.permutations(cells)), count, costs) == cut
    known = [costs[c] for c in cells if c in costs]
    default = sorted(known)[len(known) // 2] if known else 1.0
    cost = {c: costs.get(c, default) for c in cells}
    load = [sum(cost[c] for c in cells if cut[c] == i) for i in range(1, count + 1)]
    if cells:
        # The median of an even count is the mean of the middle two: within the largest cost.
        assert max(load) <= sum(load) / count + max(max(cost.values()), max(known, default=1.0)) + 1e-6


def test_more_shards_than_cells_leaves_some_empty_and_loses_none() -> None:
    cut = assign([("a", "x")], 3)
    assert cut == {("a", "x"): 1}


@pytest.mark.parametrize("text", ["0/1", "2/1", "1", "-1/2", "1/2/3", " 1/2x"])
def test_shard_specs_that_name_no_slice_are_refused(text: str) -> None:
    with pytest.raises(ShardError, match="give I/N"):
        Shard.parse(text)


def test_a_report_over_the_bound_or_not_a_report_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"cells": []}) + " " * 100)
    monkeypatch.setattr(shards, "MAX_REPORT_BYTES", 50)
    with pytest.raises(ShardError, match="is over"):
        shards.read_report(big)
    monkeypatch.undo()
    for text in ("[]", '{"cells": [{"scenario": 1}]}', "nope", '{"cells": [{"scenario": "a", "mode": "b", '
                 '"status": "maybe", "seconds": 1}]}'):  # fmt: skip
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ShardError, match="is not a `devshim compat --json` report"):
            shards.read_report(bad)

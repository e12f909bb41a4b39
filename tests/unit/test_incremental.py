"""EncodedList gives every item's encoding in order, and encodes only items it has not seen in the
last list (matched by identity; a few shifted items at most are encoded again): the property that
keeps a health change among 10,000 devices cheap for ListAndWatch and the inventory."""

from __future__ import annotations

import random

from shim.incremental import EncodedList


class Item:
    """Equal values in different objects must count as new items: identity, not equality."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Item) and other.value == self.value

    def __hash__(self) -> int:
        return self.value


def test_each_list_is_encoded_in_order_and_only_new_items_are_encoded() -> None:
    rng = random.Random(3)
    encoded: list[Item] = []

    def encode(item: Item) -> str:
        encoded.append(item)
        return f"<{item.value}>"

    encodings = EncodedList(encode)
    items = [Item(i) for i in range(200)]
    assert list(encodings.encode(items)) == [f"<{i}>" for i in range(200)]
    assert len(encoded) == 200
    for step in range(40):
        encoded.clear()
        before = set(map(id, items))
        if step % 3 == 0:  # some replaced in place
            for i in rng.sample(range(len(items)), 3):
                items[i] = Item(items[i].value)
        elif step % 3 == 1:  # added and removed
            del items[rng.randrange(len(items))]
            items.insert(rng.randrange(len(items)), Item(rng.randrange(1000)))
        else:  # reordered (more than a few moved), nothing new
            rng.shuffle(items)
        assert list(encodings.encode(items)) == [f"<{item.value}>" for item in items]
        new = {id(i) for i in items if id(i) not in before}
        again = [i for i in encoded if id(i) not in new]
        assert new <= set(map(id, encoded))
        # Items already seen are encoded again only when a few shifted within a same-length list.
        assert not again if step % 3 != 1 else len(again) <= EncodedList.FEW
    assert list(encodings.encode([])) == []
    assert list(encodings.encode(items[:1] * 3)) == [f"<{items[0].value}>"] * 3

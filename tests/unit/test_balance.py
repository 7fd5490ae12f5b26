"""Which partition a node pulls to even out the cluster (`cluster.balance.pick`): only from a
node that serves at least two more than it, only one it keeps an in-sync copy of, and nodes
pulling at once from one node ask for different partitions; repeated pulls end balanced."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memgate.cluster.balance import pick

pytestmark = pytest.mark.unit

EVERYWHERE = ["n0", "n1", "n2"]


def test_a_node_with_nothing_pulls_from_the_busiest_what_it_keeps_in_sync() -> None:
    held = {"storage.p0": "n0", "storage.p1": "n0", "storage.p2": "n0"}
    in_sync = {name: ["n1", "n2"] for name in held}
    assert pick("n1", held, in_sync) in held
    assert pick("n0", held, in_sync) is None  # never pushes
    assert pick("n1", held, {name: ["n2"] for name in held}) is None  # no copy to take over


def test_one_more_than_another_is_balanced_enough() -> None:
    held = {"storage.p0": "n0", "storage.p1": "n0", "storage.p2": "n1", "storage.p3": "n2"}
    in_sync = {name: EVERYWHERE for name in held}
    assert pick("n1", held, in_sync) is None
    assert pick("n2", held, in_sync) is None


def test_two_nodes_pulling_from_one_ask_for_different_partitions() -> None:
    held = {f"storage.p{i}": "n0" for i in range(2)}
    in_sync = {name: ["n1", "n2"] for name in held}
    assert pick("n1", held, in_sync) != pick("n2", held, in_sync)


@given(st.integers(min_value=1, max_value=16), st.integers(min_value=1, max_value=5),
       st.data())
def test_pulling_until_nobody_pulls_ends_with_shares_at_most_one_apart(
        partitions: int, nodes: int, data: st.DataObject) -> None:
    names = [f"n{i}" for i in range(nodes)]
    held = {f"storage.p{p}": data.draw(st.sampled_from(names)) for p in range(partitions)}
    in_sync = {name: names for name in held}
    for _ in range(partitions * nodes):
        moved = False
        for node in names:
            if (name := pick(node, held, in_sync)) is not None:
                held[name] = node
                moved = True
        if not moved:
            break
    count = Counter({n: 0 for n in names})
    count.update(held.values())
    assert max(count.values()) - min(count.values()) <= 1

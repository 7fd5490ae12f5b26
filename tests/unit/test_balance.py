"""Which partition a node pulls to even out the cluster (`cluster.balance.pick`): only from a
node that serves at least two more than it, only one it keeps an in-sync copy of (else it
copies one first: `to_copy`), and nodes pulling at once from one node ask for different
partitions; repeated pulls end balanced, each store keeping one standby."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memgate.cluster.balance import pick, to_copy

pytestmark = pytest.mark.unit

EVERYWHERE = ["n0", "n1", "n2"]


def test_a_node_with_nothing_pulls_from_the_busiest_what_it_keeps_in_sync() -> None:
    held = {"storage.p0": "n0", "storage.p1": "n0", "storage.p2": "n0"}
    in_sync = {name: ["n1", "n2"] for name in held}
    assert pick("n1", held, in_sync) in held
    assert pick("n0", held, in_sync) is None  # never pushes
    assert pick("n1", held, {name: ["n2"] for name in held}) is None  # no copy to take over


def test_a_node_that_keeps_no_copy_of_the_busiest_nodes_partitions_copies_one_first() -> None:
    held = {"storage.p0": "n0", "storage.p1": "n0", "storage.p2": "n0"}
    in_sync = {name: ["n1"] for name in held}  # one standby each, all on one node
    assert pick("n2", held, in_sync) is None
    assert to_copy("n2", held, in_sync) in held
    assert to_copy("n1", held, in_sync) is None  # it takes one over at once
    assert to_copy("n0", held, in_sync) is None


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
    # one standby each (another node, if any)
    in_sync = {name: [data.draw(st.sampled_from([n for n in names if n != owner] or names))]
               for name, owner in held.items()}
    for _ in range(2 * partitions * nodes):
        moved = False
        for node in names:
            if (name := pick(node, held, in_sync)) is not None:
                in_sync[name] = [held[name]]  # the old owner comes back as its standby
                held[name] = node
                moved = True
            elif (name := to_copy(node, held, in_sync)) is not None:
                in_sync[name] = [*in_sync[name], node]
                moved = True
        if not moved:
            break
    count = Counter({n: 0 for n in names})
    count.update(held.values())
    assert max(count.values()) - min(count.values()) <= 1

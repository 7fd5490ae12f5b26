"""Weighted Reciprocal Rank Fusion and the sequence window over fused scores, as pure functions."""

from __future__ import annotations

import pytest

from memgate.policy.fusion import Fused, rrf
from memgate.policy.sequence import Window, widen

pytestmark = pytest.mark.unit

# memories remembered in this order in one namespace; each one's neighbours, nearest first
ORDER = ["m0", "m1", "m2", "m3", "m4", "m5", "m6"]


def around(width: int, order: list[str] = ORDER) -> dict[str, tuple[list[str], list[str]]]:
    return {m: (order[max(0, i - width): i][::-1], order[i + 1: i + 1 + width])
            for i, m in enumerate(order)}


def scores(fused: list[Fused]) -> dict[str, float]:
    return {f.memory_id: f.score for f in fused}


def test_channel_weights_scale_each_reciprocal_rank() -> None:
    fused = rrf({"bm25": ["a", "b"], "cosine": ["b"]}, 60, {"bm25": 2.0, "cosine": 0.5})
    assert scores(fused) == pytest.approx({"a": 2 / 61, "b": 2 / 62 + 0.5 / 61})
    assert (fused[0].memory_id, fused[0].ranks) == ("b", {"bm25": 2, "cosine": 1})


def test_without_weights_every_channel_counts_once() -> None:
    assert scores(rrf({"x": ["a"], "y": ["a"]}, 60)) == pytest.approx({"a": 2 / 61})
    assert scores(rrf({"x": ["a"]}, 60, {"y": 3.0})) == pytest.approx({"a": 1 / 61})


def test_a_memory_gains_from_its_neighbours_with_decay_per_place() -> None:
    fused = [Fused("m3", 1.0, {"bm25": 1})]
    window = Window(width=2, decay=0.5, weight=0.4, head=5)
    widened = scores(widen(fused, around(2), window))
    assert widened == pytest.approx({"m3": 1.0, "m2": 0.4, "m4": 0.4, "m1": 0.2, "m5": 0.2})


def test_each_place_counts_the_better_of_its_two_neighbours() -> None:
    fused = [Fused("m2", 1.0), Fused("m4", 0.6)]
    widened = scores(widen(fused, around(1), Window(width=1, decay=1.0, weight=0.5, head=5)))
    # m3 sits between the two: the better one (m2) lends, not their sum
    assert widened["m3"] == pytest.approx(0.5)
    assert widened["m2"] == pytest.approx(1.0)  # m4 is two places away: width 1 stops short
    assert widened["m1"] == pytest.approx(0.5) and widened["m5"] == pytest.approx(0.3)


def test_a_drawn_in_neighbour_can_pass_a_weak_match() -> None:
    fused = [Fused("m3", 1.0), Fused("m6", 0.3)]
    ranked = widen(fused, around(1), Window(width=1, decay=1.0, weight=0.5, head=5))
    assert [f.memory_id for f in ranked][:3] == ["m3", "m2", "m4"]  # ties in first-seen order
    assert {f.memory_id: f.ranks for f in ranked}["m2"] == {}  # in no channel's list


def test_only_the_fused_head_lends() -> None:
    fused = [Fused("m1", 1.0), Fused("m5", 0.9)]
    widened = scores(widen(fused, around(1), Window(width=1, decay=1.0, weight=0.5, head=1)))
    assert set(widened) == {"m0", "m1", "m2", "m5"}


def test_the_window_is_off_at_width_zero_and_without_neighbours() -> None:
    fused = [Fused("m3", 1.0), Fused("m1", 0.5)]
    assert widen(fused, around(2), Window(width=0)) == fused
    assert widen(fused, {}, Window()) == fused
    assert Window(weight=0).on is False


def test_only_the_neighbours_given_lend_or_gain() -> None:
    # m2 is filtered out or hidden: the channels report m1 and m3 as neighbours of each other
    allowed = ["m0", "m1", "m3", "m4"]
    widened = scores(widen([Fused("m3", 1.0)], around(1, allowed),
                           Window(width=1, decay=1.0, weight=0.5, head=5)))
    assert set(widened) == {"m1", "m3", "m4"}


def test_a_raised_memory_never_passes_the_neighbour_that_lent_to_it() -> None:
    # consecutive RRF scores are close: an uncapped bonus would put m4 above m3
    fused = [Fused("m3", 2 / 61), Fused("m4", 1 / 62 + 1 / 63), Fused("m0", 1 / 64)]
    ranked = widen(fused, around(1), Window(width=1, decay=1.0, weight=0.5, head=5))
    assert [f.memory_id for f in ranked][:2] == ["m3", "m4"]
    assert scores(ranked)["m4"] == pytest.approx(2 / 61)
    assert scores(ranked)["m4"] < scores(ranked)["m3"]

"""Reciprocal Rank Fusion (SPEC §3.5): score = Σ w_c / (k + rank_c), ranks counted from 1.

Each channel's weight `w_c` is configuration (1 when not given: the plain RRF of the SPEC). A
channel weighted 0 fuses nothing: its ranks are reported for the memories the others fused.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

NO_RANKS: Mapping[str, int] = MappingProxyType({})


class Fused(NamedTuple):
    """A fused memory (a tuple: every recall makes one per id its channels return)."""

    memory_id: str
    score: float
    ranks: Mapping[str, int] = NO_RANKS


def rrf(rankings: dict[str, list[str]], k: int,
        weights: Mapping[str, float] | None = None) -> list[Fused]:
    """Fuse ranked lists of ids; best first, ties kept in first-seen order (stable)."""
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for channel, ids in rankings.items():
        weight = 1.0 if weights is None else weights.get(channel, 1.0)
        for rank, memory_id in enumerate(ids, start=1):
            held = ranks.get(memory_id)
            if held is None:
                ranks[memory_id] = {channel: rank}
            else:
                held[channel] = rank
            if weight:
                scores[memory_id] = scores.get(memory_id, 0.0) + weight / (k + rank)
    order = sorted(scores, key=scores.__getitem__, reverse=True)  # stable, reversed or not
    return [Fused(memory_id, scores[memory_id], ranks[memory_id]) for memory_id in order]

"""Reciprocal Rank Fusion (SPEC §3.5): score = Σ 1 / (k + rank), ranks counted from 1."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fused:
    memory_id: str
    score: float
    ranks: dict[str, int] = field(default_factory=dict)


def rrf(rankings: dict[str, list[str]], k: int) -> list[Fused]:
    """Fuse ranked lists of ids; best first, ties kept in first-seen order (stable)."""
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for channel, ids in rankings.items():
        for rank, memory_id in enumerate(ids, start=1):
            scores[memory_id] = scores.get(memory_id, 0.0) + 1.0 / (k + rank)
            ranks.setdefault(memory_id, {})[channel] = rank
    order = sorted(scores, key=lambda memory_id: -scores[memory_id])
    return [Fused(memory_id, scores[memory_id], ranks[memory_id]) for memory_id in order]

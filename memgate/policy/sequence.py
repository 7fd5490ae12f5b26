"""The sequence window over fused scores (issue 12), a step after Reciprocal Rank Fusion.

Memories remembered one after the other in a namespace (the turns of a conversation, the steps
of a task) answer questions together: the turn that matches the words is often next to the one
that holds the answer. Each memory therefore gains from its neighbours' fused scores:

    f'[i] = f[i] + weight · Σ_{d=1..width} decay^(d−1) · max(f[i−d], f[i+d])

where i−d and i+d are the memories remembered d places before and after i in i's namespace
(by seq, among those the recall's filters allow and that are not hidden). Only the fused head
(the best `head`) lends, so a memory with no match of its own can be drawn in next to a strong
one, and the cost is O(head · width). The neighbours come from the channels' catalogs.

A memory the window raises never passes the best neighbour that lent to it (nor falls below its
own fused score): RRF scores of consecutive ranks differ by a percent or two, so an uncapped
bonus would reorder the matches themselves, and the best match would lose its place to its
neighbour (bench/quality.py: fused@1 0.83 → 0.42).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

from memgate.policy.fusion import Fused

BELOW = 1 - 1e-9  # a memory drawn up by the window stays just below the one that lent most

# A memory's neighbours: (the ones remembered before it, the ones after), nearest first.
Neighbours = Mapping[str, tuple[Sequence[str], Sequence[str]]]


@dataclass(frozen=True)
class Window:
    """How far (`width` places each way), how strongly (`weight`) and with what fall-off per
    place (`decay`) neighbours lend; `head`: how many of the fused best lend. Width 0: off."""

    width: int = 2
    decay: float = 0.8
    weight: float = 0.5
    head: int = 5

    @property
    def on(self) -> bool:
        return self.width > 0 and self.weight > 0 and self.head > 0


def widen(fused: list[Fused], neighbours: Neighbours, window: Window) -> list[Fused]:
    """`fused` rescored by the window, best first (ties in the fused order, memories drawn in
    only by neighbours after them); a lender without known neighbours lends nothing."""
    if not window.on or not fused:
        return fused
    # lent[(i, d)]: the best score among i's two neighbours d places away that lend
    lent: dict[tuple[str, int], float] = {}
    for lender in fused[: window.head]:
        before, after = neighbours.get(lender.memory_id, ((), ()))
        for side in (before, after):
            for distance, memory_id in enumerate(side[: window.width], start=1):
                key = (memory_id, distance)
                lent[key] = max(lent.get(key, 0.0), lender.score)
    if not lent:
        return fused
    bonus: dict[str, float] = {}
    best: dict[str, float] = {}  # the best lender's score: the window never passes it
    for (memory_id, distance), score in lent.items():
        bonus[memory_id] = (bonus.get(memory_id, 0.0)
                            + window.weight * window.decay ** (distance - 1) * score)
        best[memory_id] = max(best.get(memory_id, 0.0), score)
    known = {f.memory_id for f in fused}
    drawn = [Fused(memory_id, 0.0) for memory_id in bonus if memory_id not in known]
    widened = [f if f.memory_id not in bonus
               else f._replace(score=max(f.score, min(f.score + bonus[f.memory_id],
                                                      best[f.memory_id] * BELOW)))
               for f in [*fused, *drawn]]
    return sorted(widened, key=itemgetter(1), reverse=True)  # stable: ties keep the fused order

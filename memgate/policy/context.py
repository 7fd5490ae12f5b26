"""Conversation turns and the channels that rank them by what surrounds them (issue 12).

The context channel's document: a conversation turn with the turns around it.

A question about a conversation often names the words of the turn next to the one that holds
the answer ("What did Caroline adopt?" — the answer turn says "we got her last week"). The
context channel therefore ranks each turn by BM25 over its own text three times (so its own
words still weigh most) and the text of up to `WIDTH` turns remembered before it and after it
in its namespace (current versions, by seq). The lab measured this document best of the
shapes tried (±1, ±2, before only, own text once to three times), LoCoMo development half.

Only memories in dialogue form take part: a turn is a memory whose text starts with a speaker,
one to three capitalised words and a colon ("Caroline: ..."). Independent facts have no
neighbours worth reading: ungated, the channel sank `bench/quality.py` fused@1 from 0.80 to
0.58, and none of its memories is a turn. A turn's neighbours that are not turns lend nothing.

With the conversation channel on, turns leave the plain BM25 and cosine lists (and so the
sequence window, whose lenders are BM25 matches) and are ranked by one score that reads both
the words around a turn and its meaning along the conversation:

    conversationᵢ = 0.5 · contextᵢ / max context + s'ᵢ + 0.15 · [the query names iᵢ's speaker]
                    + priorᵢ
    s'ᵢ = sᵢ + 0.5 · max(sᵢ₋₁, sᵢ₊₁) + 0.35 · max(sᵢ₋₂, sᵢ₊₂)
    priorᵢ = 0.5 · min(ln wordsᵢ / ln 20, 1) − 0.1 · [turn i ends with "?"]

where context is the context channel's BM25 score (0 when no word matches) and s the cosine of
the turn, smoothed over the allowed turns of each namespace by seq at query time. The prior says
how much a turn can tell, whatever the query: a short turn ("Wow, great!") or one that asks
holds no fact, and its neighbours' cosine and words otherwise lift it as much as the turn that
answers (issue 44: LoCoMo development half 0.781 → 0.794, `docs/experiments/recall-quality.md`);
in unspaced scripts two characters count as a word. The indexer reports the context scores, the
embedder the smoothed ones with the speaker bonus and the prior, each for its best `depth`; a
turn missing from the embedder's list counts its last score (scores below it are not known,
only bounded). One score, not three RRF channels: fusing the same three signals by rank loses
their magnitudes (docs/DECISIONS.md, "Recall on conversations: one conversation
channel, scored, not three fused by rank"). The conversation channel then takes its place in
the RRF like any other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

TURN = re.compile(r"^[A-Z][\w.'-]*( [A-Z][\w.'-]*){0,2}: ")
# Scripts written without spaces (as the indexer's CJK n-grams): two characters count as a word.
UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
WIDTH = 2  # turns each way whose text joins a turn's context
OWN = 3  # times a turn's own text is repeated in its context
SMOOTHING = (0.5, 0.35)  # the weight of the better neighbour 1 and 2 places away
CONTEXT = 0.5  # the weight of the context score (a share of the best) in the conversation score
SPEAKER = 0.15  # added to a turn's smoothed cosine when the query names its speaker
LENGTH = 0.5  # a turn's prior at `FULL_WORDS` words or more; less, by the log of its words
FULL_WORDS = 20
ASKING = 0.1  # taken from the prior of a turn that ends with a question mark (? or ？)


class Turn(NamedTuple):
    """What the embedder keeps of a turn: its speaker (case-folded) and its prior."""

    speaker: str
    prior: float


def is_turn(text: str) -> bool:
    """Whether a memory's text is a conversation turn ("Speaker: text")."""
    return TURN.match(text) is not None


def context(own: str, around: Sequence[str], texts: Mapping[str, str]) -> str:
    """A turn's context document: its text `OWN` times and the texts of the memories `around`
    it (ids; those that are turns and whose text is known)."""
    neighbours = (texts[i] for i in around if i in texts and is_turn(texts[i]))
    return " ".join([*[own] * OWN, *neighbours])


def speaker(text: str) -> str | None:
    """The speaker of a turn, case-folded (None: not a turn)."""
    found = TURN.match(text)
    return None if found is None else text[: text.index(":")].lower()


def turn(text: str) -> Turn | None:
    """A turn's speaker and prior (the formula above; None: not a turn)."""
    name = speaker(text)
    if name is None:
        return None
    unspaced = len(UNSPACED.findall(text))
    words = max(len(UNSPACED.sub(" ", text).split()) + unspaced // 2, 1)
    prior = LENGTH * min(math.log(words) / math.log(FULL_WORDS), 1.0)
    return Turn(name, prior - ASKING * text.rstrip().endswith(("?", "？")))


def smooth(scores: np.ndarray) -> np.ndarray:
    """Cosine scores of consecutive turns (one namespace, by seq), each raised by its
    neighbours' (`SMOOTHING`; beyond the ends, 0)."""
    smoothed = scores.copy()
    for distance, weight in enumerate(SMOOTHING, start=1):
        before = np.zeros_like(scores)
        before[distance:] = scores[:-distance]
        after = np.zeros_like(scores)
        after[:-distance] = scores[distance:]
        smoothed += weight * np.maximum(before, after)
    return smoothed


def conversation(context: Sequence[tuple[str, float]], smoothed: Sequence[tuple[str, float]],
                 depth: int) -> list[str]:
    """The conversation channel: the best `depth` turns by the score above, from the context
    channel's (id, BM25 score) and the embedder's (id, smoothed cosine + speaker bonus), each
    best first. Either may be empty (its channel missed its deadline)."""
    best = context[0][1] if context and context[0][1] > 0 else 1.0
    floor = smoothed[-1][1] if smoothed else 0.0
    score = dict(smoothed)
    words = {memory_id: CONTEXT * value / best for memory_id, value in context}
    total = {memory_id: score.get(memory_id, floor) + words.get(memory_id, 0.0)
             for memory_id in [*score, *words]}
    return sorted(total, key=lambda memory_id: -total[memory_id])[:depth]

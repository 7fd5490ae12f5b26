"""The conversation channel offline (issue 44): `bench.conversations`' answer in seconds, to tune.

    .venv/bin/python -m bench.conversations_lab [--data PATH] [--cache DIR]

`bench/conversations.py` starts memgate and asks over the bus: minutes on 2 cores, longer under
load. This runs the same rankers without the bus, on one process: each conversation's turns,
masked as governance masks them, go into a real `OwnerIndex` with their context documents (the
turns `context.WIDTH` places around each) and into a real `Catalog` with their vectors (the
compute model the embedder runs) and turns (`context.turn`: speaker and prior). Each question is
then ranked as the indexer and the embedder rank it (context BM25; cosine smoothed along the
conversation, plus the speaker bonus and the prior; each part's best `depth`) and fused as recall
fuses it (`context.conversation`). On LoCoMo every memory is a turn, so that is the recall's
order: on the development half it gave `bench.conversations`' recall@10 on every one of the 762
questions (2026-12-07). Change `policy/context.py` and run again; confirm a kept change with
`bench.conversations`.

The vectors (the slow part, ~2 min) are kept in `--cache` (default: the OS temp directory, never
the repository: the data is CC BY-NC), keyed by the data file and the model; no memory text,
question or answer is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench.conversations import (
    CATEGORIES, DEFAULT_DATA, LIMIT, Conversation, evidence_recall, load_conversations,
)
from memgate.app.settings import Settings
from memgate.contracts.internal import CatalogRows, Owner, RecallFilters
from memgate.embedding.model import OnnxEmbedder
from memgate.policy import context
from memgate.policy.masking import mask
from memgate.storage.catalog import Catalog
from memgate.storage.text_index import OwnerIndex

DEPTH = Settings().recall_depth
OWNER = Owner(tenant="lab", subject_id="lab")
START = datetime(2026, 1, 1, tzinfo=UTC)  # every turn's created_at (none is filtered by time)


def vectors(texts: Sequence[str], questions: Sequence[str], cache: Path) -> np.ndarray:
    """The vectors of `texts` then `questions`, from `cache` when made before."""
    settings = Settings()
    model = settings.compute_model()
    key = hashlib.sha256("\n".join([str(model), *texts, *questions]).encode()).hexdigest()[:16]
    path = cache / f"memgate-locomo-lab-{key}.npy"
    if path.exists():
        kept: np.ndarray = np.load(path)
        return kept
    embedder = OnnxEmbedder(model, settings.embedding_tokenizer, threads=1)
    made = np.vstack([embedder.embed([text]) for text in [*texts, *questions]])
    np.save(path, made)
    return made


def ranked(conversation: Conversation, cache: Path, index_dir: Path) -> list[list[str]]:
    """Each question's conversation channel, best first (dialog ids)."""
    texts = [mask(text).text for _, text in conversation.turns]
    ids = [dialog_id for dialog_id, _ in conversation.turns]
    by_id = dict(zip(ids, texts, strict=True))
    questions = [q.text for q in conversation.questions]
    matrix = vectors(texts, questions, cache)
    index = OwnerIndex(index_dir / conversation.sample_id)
    around = (range(max(i - context.WIDTH, 0), min(i + context.WIDTH + 1, len(ids)))
              for i in range(len(ids)))
    index.add(list(by_id.items()), {ids[i]: context.context(texts[i], [ids[j] for j in near
                                                                       if j != i], by_id)
                                    for i, near in enumerate(around)})
    index.commit()
    catalog = Catalog(dim=matrix.shape[1])
    catalog.apply(CatalogRows(
        high_seq=len(ids), memory_ids=ids, seqs=list(range(1, len(ids) + 1)),
        namespaces=[conversation.sample_id] * len(ids), keys=[None] * len(ids),
        collection_ids=[None] * len(ids), created_at=[START] * len(ids),
        superseded_at=[None] * len(ids), legal_hold=[False] * len(ids)))
    catalog.set_vectors(ids, matrix[: len(ids)])
    catalog.set_turns({memory_id: context.turn(text) for memory_id, text in by_id.items()})
    allowed = catalog.allowed(RecallFilters(owner=OWNER))
    turns = catalog.turns()
    orders = []
    for question, vector in zip(questions, matrix[len(ids):], strict=True):
        smoothed = catalog.smoothed(catalog.similarities(vector), allowed, context.smooth)
        smoothed += context.SPEAKER * catalog.named(question) + catalog.priors()
        orders.append(context.conversation(
            index.rank_context(question, None, DEPTH),
            catalog.best_scored(smoothed, allowed & turns, DEPTH), DEPTH))
    return orders


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    rows: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as index_dir:
        for conversation in load_conversations(args.data):
            orders = ranked(conversation, args.cache, Path(index_dir))
            scores = [(q.category, evidence_recall(order[:LIMIT], q.evidence))
                      for q, order in zip(conversation.questions, orders, strict=True)]
            rows += scores
            print(f"{conversation.sample_id}: {statistics.fmean(r for _, r in scores):.3f}",
                  flush=True)
    by_category = " / ".join(f"{statistics.fmean(r for c, r in rows if c == category):.3f}"
                             for category in CATEGORIES)
    print(f"conversation channel, recall@{LIMIT}: {statistics.fmean(r for _, r in rows):.3f} "
          f"(n {len(rows)}) · categories 1 / 2 / 3 / 4: {by_category}")


if __name__ == "__main__":
    main()

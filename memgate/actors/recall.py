"""The recall actor: fused ranking over all of an owner's memories (SPEC §3.5).

1. the query is embedded here (its own model; concurrent queries batched) while storage answers
   the recall's scope: the owner's newest seq, how many versions the filters allow (current at
   `asOf`, legal holds out, namespace, collection, context set; the newest `window` of them
   when an operator caps it) and the citing ones among them, ids and citations only;
2. the registry verifies those citations (hidden memories never take a place) and counts the
   entities the query names in each one's passages (the entity channel);
3. BM25 from the indexer and cosine from the embedder are asked in parallel, each for its best
   `depth` under the same filters, searched in its own index; both catch up to the newest seq
   first (read-your-writes). With the conversation channel weighted (`policy/context.py`),
   conversation turns leave the BM25 and cosine lists: the indexer's reply carries their
   context scores (BM25 over each turn with the turns around it), the embedder's their cosine
   smoothed along the conversation, and the conversation channel ranks them by both;
4. the cosine channel has a deadline covering query embedding and scoring, counted from the
   start of the recall: when it passes, the answer goes out without it, `degraded: ["cosine"]`;
   the embedder spends what is left of it, but a margin, embedding the versions the filters
   allow that have no vector yet, ahead of its other work, then ranks without those still
   missing, which degrades "cosine" too; BM25 has a deadline of its own (`degraded: ["bm25"]`);
5. Reciprocal Rank Fusion with k and per-channel weights, then the sequence window
   (`policy/sequence.py`): the BM25 matches among the fused head lend to the memories
   remembered next to them in their namespace (the indexer reports those neighbours, under the
   same filters, hidden ones out);
6. storage reads only the head's rows (those that still exist and match), live citation
   re-verification runs on them, and the next ones are taken until `limit` are shown; ties go
   to the newer.

Stateless apart from the read-only model: any number run in one queue group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from functools import partial
from pathlib import Path

import numpy as np

from memgate.bus import parse, subjects
from memgate.contracts import Memory, Ranks, RecalledMemory, RecallResult
from memgate.contracts.errors import MemgateError
from memgate.contracts.internal import (
    Ranking, RankRequest, RecallFilters, RecallQuery, RowsRequest,
)
from memgate.contracts.registry import Verification
from memgate.embedding.batching import Batcher
from memgate.embedding.model import OnnxEmbedder
from memgate.observe import tracing
from memgate.policy import context
from memgate.policy.citations import apply
from memgate.policy.fusion import Fused, rrf
from memgate.policy.sequence import Window, widen
from memgate.ports.bus import Requester
from memgate.ports.embedder import LoadEmbedder
from memgate.ports.ranking import BusRankers, Rankers
from memgate.ports.registry import BusRegistry, Registry
from memgate.ports.storage import BusStorage, Storage
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Serial

QUEUE = "recall"
# One ONNX thread: a query's int8 run is no faster on two, and the second core is left to the
# BM25 and cosine work the recall waits for meanwhile (docs/experiments/embedding.md, "Figures
# quoted from the code").
QUERY_THREADS = 1
HEAD_MARGIN = 5  # rows read beyond the limit, for hidden, deleted or superseded ones
# Of the cosine deadline, what the embedder may not spend embedding the recall's versions: its
# scoring, its reply and the hops back, under load.
RANK_MARGIN_S = 0.15


async def within(work: Awaitable[Ranking], seconds: float) -> Ranking | None:
    """A channel's ranking, or None when it missed its deadline or is unavailable (awaited in
    the caller's task: no task of its own to wake)."""
    try:
        async with asyncio.timeout(max(seconds, 0.0)):
            return await work
    except (TimeoutError, MemgateError):
        return None


class RecallActor(ActorBase):
    name = "recall"
    _batcher = Opened[Batcher]()

    def __init__(self, *, storage: Storage, registry: Registry, rankers: Rankers,
                 embedder: LoadEmbedder, window: int | None, rrf_k: int,
                 cosine_deadline_ms: int, bm25_deadline_ms: int, batch: int,
                 depth: int = 100, depth_bm25: int | None = None,
                 weights: Mapping[str, float] | None = None,
                 sequence: Window | None = None) -> None:
        self._storage = storage
        self._registry = registry
        self._rankers = rankers
        self._load = embedder
        self._window = window
        self._depth = depth
        self._depth_bm25 = depth if depth_bm25 is None else min(depth, depth_bm25)
        self._k = rrf_k
        self._weights = dict(weights or {})
        # the conversation channel is asked only when it counts (weight 0 or not given: off)
        self._conversation = any(self._weights.get(name, 0.0) > 0
                                 for name in ("conversation", "context", "smoothed"))
        self._sequence = sequence or Window(width=0)
        self._cosine_deadline = cosine_deadline_ms / 1000
        self._bm25_deadline = bm25_deadline_ms / 1000
        self._batch = batch
        self._thread = Serial("recall.model")

    @classmethod
    def on_bus(cls, bus: Requester, *, partitions: int, model: Path, tokenizer: Path,
               window: int | None, rrf_k: int, cosine_deadline_ms: int, bm25_deadline_ms: int,
               batch: int, depth: int = 100, depth_bm25: int | None = None,
               weights: Mapping[str, float] | None = None,
               sequence: Window | None = None) -> RecallActor:
        """Recall whose collaborators are the other actors over `bus`, with the ONNX model."""
        return cls(storage=BusStorage(bus, partitions=partitions), registry=BusRegistry(bus),
                   rankers=BusRankers(bus, partitions=partitions),
                   embedder=partial(OnnxEmbedder, model, tokenizer, threads=QUERY_THREADS),
                   window=window, rrf_k=rrf_k,
                   cosine_deadline_ms=cosine_deadline_ms, bm25_deadline_ms=bm25_deadline_ms,
                   batch=batch, depth=depth, depth_bm25=depth_bm25, weights=weights,
                   sequence=sequence)

    async def start(self) -> None:
        encoder = await self._thread(self._load)
        await self._thread(encoder.embed, ["warm up"])  # the first run allocates
        self._batcher = Batcher(encoder.embed, self._thread, self._batch)
        self._batcher.start()

    async def stop(self) -> None:
        if RecallActor._batcher.opened(self):
            await self._batcher.stop()
        self._thread.shutdown()

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(subjects.recall_internal(), self.recall, queue=QUEUE, max_workers=64)]

    async def _cosine(self, request: RankRequest, vector: asyncio.Future[np.ndarray],
                      until: float) -> Ranking:
        """The cosine ranking; the embedder may embed the versions it lacks until `until`
        (loop time), less `RANK_MARGIN_S`."""
        query = (await vector).tolist()
        left = until - asyncio.get_running_loop().time() - RANK_MARGIN_S
        return await self._rankers.cosine(request.model_copy(update={
            "vector": query, "wait_ms": max(int(left * 1000), 0)}))

    async def recall(self, payload: bytes) -> RecallResult:
        """The recall of a `RecallQuery` (governance and space-memories of this process hand
        it over without the server: `BusClient(local=…)`)."""
        query = parse(RecallQuery, payload)
        loop = asyncio.get_running_loop()
        started = loop.time()
        vector = asyncio.ensure_future(self._batcher.embed(query.query))
        filters = RecallFilters(owner=query.owner, namespace=query.namespace,
                                collection_id=query.collection_id,
                                collection_ids=query.collection_ids,
                                namespaces=query.namespaces, memory_ids=query.memory_ids,
                                as_of=query.as_of,
                                window=self._window)
        words_ranked: asyncio.Future[Ranking | None] | None = None
        try:
            scope = await self._storage.recall_scope(filters)
            verdict = await self._registry.verify(query.owner.tenant, query.context_set_id,
                                                  scope.cited, query.query)
            hidden = set(verdict.hidden)
            if hidden and scope.total is not None and scope.total <= len(hidden):
                return RecallResult(memories=[], hidden=len(hidden))
            rank = RankRequest(filters=filters, query=query.query, depth=self._depth,
                               min_seq=scope.high_seq, exclude=sorted(hidden),
                               conversation=self._conversation)
            # only the memories that match the words lend to their neighbours: the indexer
            # reports the neighbours of its matches
            words = rank.model_copy(update={
                "depth": self._depth_bm25, "context": self._depth if self._conversation else 0,
                "neighbours": self._sequence.width if self._sequence.on else 0})
            # BM25 on a task of its own; cosine, the last back as a rule, in this one
            words_ranked = asyncio.ensure_future(
                within(tracing.staged("bm25", self._rankers.bm25(words)), self._bm25_deadline))
            cosine = await within(
                tracing.staged("cosine", self._cosine(rank, vector,
                                                      started + self._cosine_deadline)),
                self._cosine_deadline - (loop.time() - started))
            bm25 = await words_ranked
        finally:
            vector.cancel()
            if words_ranked is not None:
                words_ranked.cancel()
        newest_first = {memory_id: i for i, memory_id in enumerate(scope.cited)}
        matches = {i: n for i, n in verdict.entity_matches.items() if i not in hidden}
        entity = sorted(matches, key=lambda memory_id: (-matches[memory_id],
                                                        newest_first.get(memory_id, 0)))
        channels = {"bm25": bm25 and bm25.memory_ids, "cosine": cosine and cosine.memory_ids,
                    "entity": entity}
        degraded = [name for name, ids in channels.items()
                    if ids is None or (name == "cosine" and cosine and cosine.unembedded)]
        # a late indexer or embedder degrades "bm25" or "cosine" alone
        parts = {"context": bm25.context if bm25 else [],
                 "smoothed": cosine.smoothed if cosine else []}
        channels["conversation"] = context.conversation(parts["context"], parts["smoothed"],
                                                        self._depth)
        channels |= {name: [memory_id for memory_id, _ in part]
                     for name, part in parts.items()}
        with tracing.span("fusion"):
            fused = rrf({name: ids for name, ids in channels.items() if ids}, self._k,
                        self._weights)
            if bm25 is not None:
                fused = widen(fused, {memory_id: (around.before, around.after)
                                      for memory_id, around in bm25.neighbours.items()},
                              self._sequence)
        with tracing.span("rows"):
            shown, late_hidden = await self._head(query, filters, verdict, set(scope.cited),
                                                  fused)
        memories = [RecalledMemory(**m.model_dump(), score=f.score, ranks=Ranks(**f.ranks))
                    for m, f in shown]
        return RecallResult(memories=memories, degraded=degraded,
                            hidden=len(hidden) + late_hidden)

    async def _head(self, query: RecallQuery, filters: RecallFilters, verdict: Verification,
                    verified: set[str], fused: list[Fused],
                    ) -> tuple[list[tuple[Memory, Fused]], int]:
        """The first `limit` fused memories that storage still holds under the filters, with
        their rows; ties go to the newer memory. Rows citing sources the scope did not cover
        (remembered since) are verified too: (shown, how many of those were hidden)."""
        found: list[tuple[Memory, Fused]] = []
        late_hidden = 0
        taken = 0
        while len(found) < query.limit and taken < len(fused):
            batch = fused[taken: taken + query.limit - len(found) + HEAD_MARGIN]
            taken += len(batch)
            rows = (await self._storage.rows(RowsRequest(
                filters=filters, memory_ids=[f.memory_id for f in batch]))).memories
            late = {m.memory_id: m.citations for m in rows
                    if m.citations and m.memory_id not in verified}
            if late:
                extra = await self._registry.verify(query.owner.tenant, query.context_set_id,
                                                    late)
                late_hidden += len(extra.hidden)
                verified |= late.keys()
                verdict = verdict.model_copy(update={
                    "hidden": [*verdict.hidden, *extra.hidden],
                    "changed": [*verdict.changed, *extra.changed]})
            by_id = {m.memory_id: m for m in apply(verdict, rows)}
            found += [(by_id[f.memory_id], f) for f in batch if f.memory_id in by_id]
        found.sort(key=lambda pair: (-pair[1].score, -pair[0].created_at.timestamp()))
        return found[: query.limit], late_hidden

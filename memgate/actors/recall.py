"""The recall actor: fused ranking over an owner's newest candidates (SPEC §3.5).

1. the query is embedded here (its own model; concurrent queries batched) while storage
   returns the candidates: the newest `window` versions current at `asOf`, legal holds excluded;
2. the registry hides candidates whose cited sources are gone and counts the entities the query
   names; BM25 ranks from the indexer and cosine ranks from the embedder (both over the
   remaining candidates only) are asked in parallel;
3. the cosine channel has a deadline covering query embedding and scoring, counted from the
   start of the recall: when it passes, the answer goes out without it, `degraded: ["cosine"]`;
   BM25 has a deadline of its own (`degraded: ["bm25"]`);
4. Reciprocal Rank Fusion with k; ties go to the newer memory.

Stateless apart from the read-only model: any number run in one queue group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from functools import partial
from pathlib import Path

import numpy as np

from memgate.bus import NatsRouter, parse, replying, subjects
from memgate.contracts import Ranks, RecalledMemory, RecallResult
from memgate.contracts.errors import MemgateError
from memgate.contracts.internal import RankRequest, RecallQuery, StoreQuery
from memgate.embedding.batching import Batcher
from memgate.embedding.model import OnnxEmbedder
from memgate.policy.citations import apply
from memgate.policy.fusion import rrf
from memgate.ports.bus import Requester
from memgate.ports.embedder import LoadEmbedder
from memgate.ports.ranking import BusRankers, Rankers
from memgate.ports.registry import BusRegistry, Registry
from memgate.ports.storage import BusStorage, Storage
from memgate.runtime.actor import Serial, ready_route

QUEUE = "recall"


async def within(work: Awaitable[list[str]], seconds: float) -> list[str] | None:
    """A channel's ranking, or None when it missed its deadline or is unavailable."""
    try:
        return await asyncio.wait_for(work, max(seconds, 0.0))
    except (TimeoutError, MemgateError):
        return None


class RecallActor:
    name = "recall"

    def __init__(self, *, storage: Storage, registry: Registry, rankers: Rankers,
                 embedder: LoadEmbedder, window: int, rrf_k: int, cosine_deadline_ms: int,
                 bm25_deadline_ms: int, batch: int) -> None:
        self._storage = storage
        self._registry = registry
        self._rankers = rankers
        self._load = embedder
        self._window = window
        self._k = rrf_k
        self._cosine_deadline = cosine_deadline_ms / 1000
        self._bm25_deadline = bm25_deadline_ms / 1000
        self._batch = batch
        self._thread = Serial("recall.model")
        self._batcher: Batcher | None = None

    @classmethod
    def on_bus(cls, bus: Requester, *, partitions: int, model: Path, tokenizer: Path,
               window: int, rrf_k: int, cosine_deadline_ms: int, bm25_deadline_ms: int,
               batch: int) -> RecallActor:
        """Recall whose collaborators are the other actors over `bus`, with the ONNX model."""
        return cls(storage=BusStorage(bus, partitions=partitions), registry=BusRegistry(bus),
                   rankers=BusRankers(bus, partitions=partitions),
                   embedder=partial(OnnxEmbedder, model, tokenizer), window=window, rrf_k=rrf_k,
                   cosine_deadline_ms=cosine_deadline_ms, bm25_deadline_ms=bm25_deadline_ms,
                   batch=batch)

    async def start(self) -> None:
        encoder = await self._thread(self._load)
        await self._thread(encoder.embed, ["warm up"])  # the first run allocates
        self._batcher = Batcher(encoder, self._thread, self._batch)
        self._batcher.start()

    async def stop(self) -> None:
        if self._batcher is not None:
            await self._batcher.stop()
        self._thread.shutdown()

    def router(self) -> NatsRouter:
        router = NatsRouter()
        router.subscriber(subjects.recall_internal(), queue=QUEUE)(replying(self.recall))
        ready_route(router, subjects.ready(self.name), self.name)
        return router

    async def _cosine(self, request: RankRequest, vector: asyncio.Future[np.ndarray]) -> list[str]:
        return await self._rankers.cosine(
            request.model_copy(update={"vector": (await vector).tolist()}))

    async def recall(self, payload: bytes) -> RecallResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        query = parse(RecallQuery, payload)
        assert self._batcher is not None, "start() first"
        vector = asyncio.ensure_future(self._batcher.embed(query.query))
        try:
            candidates = await self._storage.candidates(StoreQuery(
                owner=query.owner, namespace=query.namespace, collection_id=query.collection_id,
                collection_ids=query.collection_ids, as_of=query.as_of, limit=self._window))
            verdict = await self._registry.verify(
                query.owner.tenant, query.context_set_id,
                {i: c for i, c in zip(candidates.memory_ids, candidates.citations, strict=True)
                 if c},
                query.query)
            hidden = set(verdict.hidden)
            eligible = [i for i in candidates.memory_ids if i not in hidden]
            if not eligible:
                return RecallResult(memories=[], hidden=len(hidden))
            rank = RankRequest(owner=query.owner, query=query.query, memory_ids=eligible)
            bm25, cosine = await asyncio.gather(
                within(self._rankers.bm25(rank), self._bm25_deadline),
                within(self._cosine(rank, vector),
                       self._cosine_deadline - (loop.time() - started)))
        finally:
            vector.cancel()
        position = {memory_id: i for i, memory_id in enumerate(candidates.memory_ids)}
        matches = {i: n for i, n in verdict.entity_matches.items() if i not in hidden}
        entity = sorted(matches, key=lambda memory_id: (-matches[memory_id], position[memory_id]))
        channels = {"bm25": bm25, "cosine": cosine, "entity": entity}
        degraded = [name for name, ids in channels.items() if ids is None]
        fused = rrf({name: ids for name, ids in channels.items() if ids}, self._k)
        top = sorted(fused, key=lambda f: (-f.score, position[f.memory_id]))[: query.limit]
        shown = apply(verdict, [candidates.memory(position[f.memory_id]) for f in top])
        memories = [RecalledMemory(**m.model_dump(), score=f.score, ranks=Ranks(**f.ranks))
                    for m, f in zip(shown, top, strict=True)]
        return RecallResult(memories=memories, degraded=degraded, hidden=len(hidden))

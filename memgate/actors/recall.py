"""The recall actor: fused ranking over an owner's newest candidates (SPEC §3.5).

1. the query is embedded here (its own model; concurrent queries batched) while storage
   returns the candidates: the newest `window` versions current at `asOf`, legal holds excluded;
2. BM25 ranks from the indexer and cosine ranks from the embedder (both over the candidates
   only) are asked in parallel; the entity list stays empty until citations carry entities;
3. the cosine channel has a deadline covering query embedding and scoring, counted from the
   start of the recall: when it passes, the answer goes out without it, `degraded: ["cosine"]`;
4. Reciprocal Rank Fusion with k; ties go to the newer memory.

Stateless apart from the read-only model: any number run in one queue group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import numpy as np

from memgate.embedding.batching import Batcher
from memgate.policy.fusion import rrf
from memgate.runtime.actor import Serial, partition_of, ready_route
from memgate.ports.registry import apply, verify
from memgate.bus import BusClient, NatsRouter, parse, replying, subjects
from memgate.contracts import Ranks, RecalledMemory, RecallResult
from memgate.contracts.errors import MemgateError
from memgate.contracts.internal import (
    Candidates, RankRequest, Ranking, RecallQuery, StoreQuery,
)
from memgate.embedding.model import OnnxEmbedder

QUEUE = "recall"


async def within(work: Awaitable[list[str]], seconds: float) -> list[str] | None:
    """A channel's ranking, or None when it missed its deadline or is unavailable."""
    try:
        return await asyncio.wait_for(work, max(seconds, 0.0))
    except (TimeoutError, MemgateError):
        return None


class RecallActor:
    name = "recall"

    def __init__(self, *, bus: BusClient, partitions: int, window: int, rrf_k: int,
                 cosine_deadline_ms: int, model: Path, tokenizer: Path, batch: int = 32) -> None:
        self._bus = bus
        self._partitions = partitions
        self._window = window
        self._k = rrf_k
        self._deadline = cosine_deadline_ms / 1000
        self._model = model
        self._tokenizer = tokenizer
        self._batch = batch
        self._thread = Serial("recall.model")
        self._batcher: Batcher | None = None

    async def start(self) -> None:
        encoder = await self._thread(OnnxEmbedder, self._model, self._tokenizer)
        await self._thread(encoder.embed, ["warm up"])
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

    async def _request_ranking(self, subject: str, request: RankRequest) -> list[str]:
        return (await self._bus.request(subject, request, Ranking)).memory_ids

    async def _cosine(self, partition: str, request: RankRequest,
                      vector: asyncio.Future[np.ndarray]) -> list[str]:
        with_vector = request.model_copy(update={"vector": (await vector).tolist()})
        return await self._request_ranking(subjects.embed(partition, "rank"), with_vector)

    async def recall(self, payload: bytes) -> RecallResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        query = parse(RecallQuery, payload)
        assert self._batcher is not None
        vector = asyncio.ensure_future(self._batcher.embed(query.query))
        partition = partition_of(query.owner.tenant, self._partitions)
        try:
            candidates = await self._bus.request(
                subjects.store(partition, "candidates"),
                StoreQuery(owner=query.owner, namespace=query.namespace,
                           collection_id=query.collection_id, collection_ids=query.collection_ids,
                           as_of=query.as_of, limit=self._window),
                Candidates)
            verdict = await verify(
                self._bus, query.owner.tenant, query.context_set_id,
                {i: c for i, c in zip(candidates.memory_ids, candidates.citations, strict=True) if c},
                query.query)
            hidden = set(verdict.hidden)
            eligible = [i for i in candidates.memory_ids if i not in hidden]
            if not eligible:
                return RecallResult(memories=[], hidden=len(hidden))
            rank = RankRequest(owner=query.owner, query=query.query, memory_ids=eligible)
            bm25, cosine = await asyncio.gather(
                within(self._request_ranking(subjects.index(partition, "rank"), rank), 10.0),
                within(self._cosine(partition, rank, vector),
                       self._deadline - (loop.time() - started)))
        finally:
            vector.cancel()
        position = {memory_id: i for i, memory_id in enumerate(candidates.memory_ids)}
        matches = verdict.entity_matches
        entity = sorted(matches, key=lambda memory_id: (-matches[memory_id], position[memory_id]))
        channels = {"bm25": bm25, "cosine": cosine, "entity": entity}
        degraded = [name for name, ids in channels.items() if ids is None]
        fused = rrf({name: ids for name, ids in channels.items() if ids}, self._k)
        top = sorted(fused, key=lambda f: (-f.score, position[f.memory_id]))[: query.limit]
        shown = apply(verdict, [candidates.memory(position[f.memory_id]) for f in top])
        memories = [RecalledMemory(**m.model_dump(), score=f.score, ranks=Ranks(**f.ranks))
                    for m, f in zip(shown, top, strict=True)]
        return RecallResult(memories=memories, degraded=degraded, hidden=len(hidden))

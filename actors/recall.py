"""The recall actor: fused ranking over an owner's newest candidates (SPEC §3.5).

1. candidates: the newest `window` versions current at `asOf` (storage; legal holds excluded);
2. BM25 ranks from the indexer, cosine ranks from the embedder (both over the candidates only),
   and the entity list (empty until citations carry entities), asked in parallel;
3. the cosine channel has a deadline covering query embedding and scoring: when it passes,
   the answer goes out without it and says `degraded: ["cosine"]`;
4. Reciprocal Rank Fusion with k; ties go to the newer memory.

Stateless: any number run in one queue group.
"""

from __future__ import annotations

import asyncio

from actors.fusion import rrf
from actors.runtime import partition_of, ready_route
from bus import BusClient, NatsRouter, parse, replying, subjects
from contracts import Ranks, RecalledMemory, RecallResult
from contracts.errors import MemgateError
from contracts.internal import (
    Candidates, GetMemories, Memories, RankRequest, Ranking, RecallQuery, StoreQuery,
)

QUEUE = "recall"


class RecallActor:
    name = "recall"

    def __init__(self, *, bus: BusClient, partitions: int, window: int, rrf_k: int,
                 cosine_deadline_ms: int) -> None:
        self._bus = bus
        self._partitions = partitions
        self._window = window
        self._k = rrf_k
        self._deadline = cosine_deadline_ms / 1000

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def router(self) -> NatsRouter:
        router = NatsRouter()
        router.subscriber(subjects.recall_internal(), queue=QUEUE)(replying(self.recall))
        ready_route(router, subjects.ready(self.name), self.name)
        return router

    async def _channel(self, subject: str, request: RankRequest, timeout: float) -> list[str] | None:
        """A channel's ranking, or None when it missed its deadline or is unavailable."""
        try:
            ranking = await asyncio.wait_for(
                self._bus.request(subject, request, Ranking, timeout=timeout), timeout)
        except (TimeoutError, MemgateError):
            return None
        return ranking.memory_ids

    async def recall(self, payload: bytes) -> RecallResult:
        query = parse(RecallQuery, payload)
        partition = partition_of(query.owner.tenant, self._partitions)
        candidates = await self._bus.request(
            subjects.store(partition, "candidates"),
            StoreQuery(owner=query.owner, namespace=query.namespace,
                       collection_id=query.collection_id, as_of=query.as_of, limit=self._window),
            Candidates)
        if not candidates.memory_ids:
            return RecallResult(memories=[])
        rank = RankRequest(owner=query.owner, query=query.query, memory_ids=candidates.memory_ids)
        bm25, cosine = await asyncio.gather(
            self._channel(subjects.index(partition, "rank"), rank, 10.0),
            self._channel(subjects.embed(partition, "rank"), rank, self._deadline))
        channels = {"bm25": bm25, "cosine": cosine, "entity": []}
        degraded = [name for name, ids in channels.items() if ids is None]
        fused = rrf({name: ids for name, ids in channels.items() if ids}, self._k)
        age = {memory_id: i for i, memory_id in enumerate(candidates.memory_ids)}
        top = sorted(fused, key=lambda f: (-f.score, age[f.memory_id]))[: query.limit]
        found = await self._bus.request(
            subjects.store(partition, "get"),
            GetMemories(owner=query.owner, memory_ids=[f.memory_id for f in top]), Memories)
        by_id = {m.memory_id: m for m in found.memories}
        memories = [
            RecalledMemory(**by_id[f.memory_id].model_dump(), score=f.score, ranks=Ranks(**f.ranks))
            for f in top if f.memory_id in by_id  # forgotten meanwhile: left out
        ]
        return RecallResult(memories=memories, degraded=degraded)

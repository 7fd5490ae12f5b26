"""The embedder actor: one partition's memory vectors, and cosine ranking of candidates.

Fed like the indexer by a durable pull consumer on `mem.evt.<p>.memory` (ids only; texts come
from storage). Query embeddings go through a batcher: requests that arrive while the model is
busy are embedded together in one ONNX call (batching under load, none when idle).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from memgate.bus import NatsRouter, parse, replying, subjects
from memgate.contracts.events import MEMORY_EVENT, MemoriesDeleted, MemoryStored, read_event
from memgate.contracts.internal import Owner, Ranking, RankRequest, Texts, TextsRequest
from memgate.embedding.batching import Batcher
from memgate.embedding.model import OnnxEmbedder
from memgate.ports.bus import Bus
from memgate.runtime.actor import Serial, ready_route
from memgate.storage.vectors import VectorStore


class EmbedderActor:
    def __init__(self, *, partition: str, path: Path, model: Path, tokenizer: Path,
                 bus: Bus, batch: int = 32) -> None:
        self.partition = partition
        self.name = f"embedder.{partition}"
        self._path = path
        self._model = model
        self._tokenizer = tokenizer
        self._bus = bus
        self._batch = batch
        self._model_thread = Serial(f"{self.name}.model")
        self._store_thread = Serial(f"{self.name}.store")
        self._vectors: VectorStore | None = None
        self._embedder: OnnxEmbedder | None = None
        self._batcher: Batcher | None = None
        self._events = bus.consumer(subjects.memory_events(partition), f"embedder-{partition}",
                                    self.on_events, batch_size=batch)

    async def start(self) -> None:
        self._embedder = await self._model_thread(OnnxEmbedder, self._model, self._tokenizer)
        await self._model_thread(self._embedder.embed, ["warm up"])  # first run allocates
        self._vectors = await self._store_thread(VectorStore, self._path)
        self._batcher = Batcher(self._embedder, self._model_thread, self._batch)
        self._batcher.start()
        await self._events.start()

    async def stop(self) -> None:
        await self._events.stop()
        if self._batcher is not None:
            await self._batcher.stop()
        if self._vectors is not None:
            await self._store_thread(self._vectors.close)
        self._model_thread.shutdown()
        self._store_thread.shutdown()

    @property
    def vectors(self) -> VectorStore:
        assert self._vectors is not None, "start() first"
        return self._vectors

    def router(self) -> NatsRouter:
        router = NatsRouter()
        router.subscriber(subjects.embed(self.partition, "rank"))(replying(self.rank))
        ready_route(router, subjects.ready(self.name), self.name)
        return router

    async def on_events(self, payloads: list[bytes]) -> None:
        stored: defaultdict[Owner, list[str]] = defaultdict(list)
        deleted: list[str] = []
        for event in [read_event(MEMORY_EVENT, p) for p in payloads]:  # all, before any work
            if isinstance(event, MemoryStored):
                if event.memory_id not in self.vectors:
                    stored[event.owner].append(event.memory_id)
            elif isinstance(event, MemoriesDeleted):
                deleted.extend(event.memory_ids)
        assert self._embedder is not None
        for owner, ids in stored.items():
            texts = await self._bus.request(subjects.store(self.partition, "texts"),
                                            TextsRequest(owner=owner, memory_ids=ids), Texts)
            if texts.items:
                matrix = await self._model_thread(self._embedder.embed,
                                                  [item.text for item in texts.items])
                await self._store_thread(self.vectors.put, owner.tenant, owner.subject_id,
                                         [item.memory_id for item in texts.items], matrix)
        if deleted:
            await self._store_thread(self.vectors.delete, deleted)

    async def rank(self, payload: bytes) -> Ranking:
        """Order the candidates that already have vectors by cosine similarity to the query
        (its vector when the caller sends one, else the query embedded here)."""
        request = parse(RankRequest, payload)
        assert self._batcher is not None
        if request.vector is not None:
            query = np.asarray(request.vector, dtype=np.float32)
        else:
            query = await self._batcher.embed(request.query)
        return Ranking(memory_ids=self.vectors.rank(query, request.memory_ids))

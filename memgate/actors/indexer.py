"""The indexer actor: keeps one partition's Tantivy indexes and ranks candidates by BM25.

Fed by `mem.evt.<p>.memory` through a durable pull consumer (at-least-once; adding a memory
twice replaces it, so redelivery is harmless; a restarted indexer resumes where it acked).
Events carry ids only: the masked text is fetched from storage, and never stored in the index.

Read-your-writes: a rank request names its candidates; any the index does not hold yet are
fetched and indexed before searching, so a memory is recallable by its words as soon as
remember has returned, however far the event consumer lags.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

from memgate.bus import NatsRouter, parse, replying, subjects
from memgate.contracts.events import MEMORY_EVENT, MemoriesDeleted, MemoryStored, read_event
from memgate.contracts.internal import Owner, Ranking, RankRequest, Texts, TextsRequest
from memgate.ports.bus import Bus
from memgate.runtime.actor import Serial, ready_route
from memgate.storage.text_index import TextIndexes


class IndexerActor:
    def __init__(self, *, partition: str, root: Path, bus: Bus) -> None:
        self.partition = partition
        self.name = f"indexer.{partition}"
        self._root = root
        self._bus = bus
        self._serial = Serial(self.name)
        self._indexes: TextIndexes | None = None
        self._locks: defaultdict[Owner, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._events = bus.consumer(subjects.memory_events(partition), f"indexer-{partition}",
                                    self.on_events)

    @property
    def indexes(self) -> TextIndexes:
        assert self._indexes is not None, "start() first"
        return self._indexes

    async def start(self) -> None:
        self._indexes = TextIndexes(self._root)
        await self._events.start()

    async def stop(self) -> None:
        await self._events.stop()
        self._serial.shutdown()

    def router(self) -> NatsRouter:
        router = NatsRouter()
        router.subscriber(subjects.index(self.partition, "rank"))(replying(self.rank))
        ready_route(router, subjects.ready(self.name), self.name)
        return router

    async def _texts(self, owner: Owner, ids: list[str] | None) -> list[tuple[str, str]]:
        texts = await self._bus.request(subjects.store(self.partition, "texts"),
                                        TextsRequest(owner=owner, memory_ids=ids), Texts)
        return [(item.memory_id, item.text) for item in texts.items]

    async def ensure_indexed(self, owner: Owner, ids: list[str]) -> None:
        index = await self._serial(self.indexes.owner, owner.tenant, owner.subject_id)
        missing = [i for i in ids if i not in index.ids]
        if missing:
            await self._serial(index.add, await self._texts(owner, missing))

    async def rebuild(self, owner: Owner, deleted: list[str]) -> None:
        index = await self._serial(self.indexes.owner, owner.tenant, owner.subject_id)
        if index.ids.isdisjoint(deleted):
            return
        items = await self._texts(owner, None)
        await self._serial(index.rebuild, items)

    async def on_events(self, payloads: list[bytes]) -> None:
        stored: defaultdict[Owner, list[str]] = defaultdict(list)
        deleted: defaultdict[Owner, list[str]] = defaultdict(list)
        for event in [read_event(MEMORY_EVENT, p) for p in payloads]:  # all, before any work
            if isinstance(event, MemoryStored):
                stored[event.owner].append(event.memory_id)
            elif isinstance(event, MemoriesDeleted):
                deleted[event.owner].extend(event.memory_ids)
        for owner, ids in stored.items():
            async with self._locks[owner]:
                await self.ensure_indexed(owner, ids)
        for owner, ids in deleted.items():
            async with self._locks[owner]:
                await self.rebuild(owner, ids)

    async def rank(self, payload: bytes) -> Ranking:
        request = parse(RankRequest, payload)
        owner = request.owner

        def rank() -> list[str] | None:  # None: some candidates are not indexed yet
            index = self.indexes.owner(owner.tenant, owner.subject_id)
            if not index.ids.issuperset(request.memory_ids):
                return None
            return index.rank(request.query, request.memory_ids)

        ranked = await self._serial(rank)
        if ranked is None:
            async with self._locks[owner]:
                await self.ensure_indexed(owner, request.memory_ids)
            ranked = await self._serial(rank) or []
        return Ranking(memory_ids=ranked)

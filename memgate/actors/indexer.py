"""The indexer actor: keeps one partition's Tantivy indexes and ranks by BM25 (SPEC §3.5).

Fed by `mem.evt.<p>.memory` through a durable pull consumer (at-least-once; adding a memory
twice replaces it, so redelivery is harmless; a restarted indexer resumes where it acked).
Events carry ids only: the masked text is fetched from storage, and never stored in the index.

Each owner it ranks for has a `Catalog` (metadata of every version, no text), loaded from
storage on first use and brought up to date by seq. A rank request carries the recall's filters:
the catalog turns them into the allowed ids, and the owner's whole index is searched for those.

Read-your-writes: a rank request names the owner's newest seq (`min_seq`, from storage); an
indexer that has applied less catches up first (the versions' metadata, then the texts it lacks),
so a memory is recallable by its words as soon as remember has returned, however far the event
consumer lags.

Events are acked once their documents are added, before the index commits them (`text_index`:
commits are deferred, and searches commit first); a restart indexes whatever a crash lost.

Conversation turns (`policy/context.py`) also get a context document: their text and the texts
of the turns up to two places before and after them in their namespace (current versions, by
seq, from the catalog). A new turn is indexed with its context, and the turns around it are
indexed again (theirs gained it); texts not at hand come from storage. A rebuild after a
deletion computes every context from the remaining versions only, so a deleted turn's words
leave its neighbours' documents too. A rank request that asks (`context`) also gets the context
channel's ranking, under the same filters.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import TypeVar

import numpy as np

from memgate.cluster import fence
from memgate.bus import parse, subjects
from memgate.contracts.erasure import Drop, SubjectCount
from memgate.contracts.events import memory_changes
from memgate.contracts.internal import (
    CatalogRequest, Owner, Ranking, RankRequest,
)
from memgate.policy import context
from memgate.ports.bus import Bus
from memgate.ports.storage import PartitionStorage
from memgate.runtime.catalogs import Catalogs
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Serial
from memgate.storage.catalog import Catalog
from memgate.storage.text_index import COMMIT_EVERY_S, OwnerIndex, TextIndexes
from memgate.tasks import cancelled

R = TypeVar("R")

# Up to this many of an owner's versions that a recall may not see (superseded, other
# namespaces) are skipped after searching the whole index; more, and the search is restricted
# to the allowed ids instead (a term-set filter costs ~1.5 ms per 1,000 ids).
SKIP_AT_MOST = 200
# Events handled at most per batch: when the consumer lags, each batch costs two round trips to
# storage per owner, so bigger batches catch up faster.
EVENT_BATCH = 256
# Owners' index work runs on this many threads, each owner's always on the same one (in order):
# a commit waits ~50 ms on fsync (Tantivy releases the GIL meanwhile), and other owners' adds
# and searches must not queue behind it. Deferred commits run on a thread of their own.
THREADS = 4

log = logging.getLogger("memgate.indexer")


class IndexerActor(ActorBase):
    indexes = Opened[TextIndexes]()

    def __init__(self, *, partition: str, root: Path, bus: Bus) -> None:
        self.partition = partition
        self.name = f"indexer.{partition}"
        self._root = root
        self._bus = bus
        self._storage = PartitionStorage(bus, partition)
        self._threads = [Serial(f"{self.name}.{i}") for i in range(THREADS)]
        self._commits = Serial(f"{self.name}.commit")
        self._catalogs = Catalogs(Catalog)
        self._added = asyncio.Event()  # documents were added: commits may be due
        self._committer: asyncio.Task[None] | None = None
        self._events = bus.consumer(subjects.memory_events(partition), f"indexer-{partition}",
                                    self.on_events, batch_size=EVENT_BATCH)

    async def start(self) -> None:
        self.indexes = TextIndexes(self._root)
        self._committer = asyncio.create_task(self._commit(), name=f"{self.name}.commit")
        await self._events.start()

    async def stop(self) -> None:
        await self._events.stop()
        await cancelled(self._committer)
        for thread in self._threads:
            thread.shutdown()
        if (indexes := IndexerActor.indexes.take(self)) is not None:
            await self._commits.unreplicated(indexes.close)
        self._commits.shutdown()

    async def _commit(self) -> None:
        """Commit the added documents as they fall due (`text_index.COMMIT_EVERY_S`)."""
        while True:
            await self._added.wait()
            self._added.clear()
            try:
                wait = await self._commits(self.indexes.commit_due)
            except Exception as exc:  # searches still commit first; try again later
                log.warning("%s: commit failed (%s)", self.name, type(exc).__name__)
                wait = COMMIT_EVERY_S
            if wait is not None:
                await asyncio.sleep(wait)
                self._added.set()

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(subjects.index(self.partition, "rank"), self.rank, max_workers=64),
                Endpoint(subjects.index(self.partition, "drop"), self.drop)]

    async def _texts(self, owner: Owner, ids: list[str] | None) -> dict[str, str]:
        return {item.memory_id: item.text for item in await self._storage.texts(owner, ids)}

    async def _use(self, owner: Owner, work: Callable[[OwnerIndex], R]) -> R:
        """`work(index)` on the owner's thread, holding the owner's index as open now (an
        earlier lookup may have been closed since, and only the open one may write)."""
        thread = self._threads[zlib.crc32(f"{owner.tenant}/{owner.subject_id}".encode())
                               % THREADS]
        return await thread(self.indexes.use, owner.tenant, owner.subject_id, work)

    async def _contexts(self, owner: Owner, catalog: Catalog, texts: dict[str, str],
                        changed: list[str]) -> dict[str, str]:
        """The context documents of the turns among `changed` and of the turns around them
        (whose documents hold theirs), by id; the texts lacking in `texts` are read from
        storage and added to it."""
        turns = [i for i in changed if context.is_turn(texts.get(i, ""))]
        if not turns:
            return {}
        current = catalog.current()
        around = catalog.neighbours(turns, current, context.WIDTH)
        touched = {i for sides in around.values() for i in (*sides.before, *sides.after)}
        around |= catalog.neighbours(touched - around.keys(), current, context.WIDTH)
        wanted = {*around, *(i for sides in around.values() for i in (*sides.before, *sides.after))}
        lacking = sorted(wanted - texts.keys())
        if lacking:
            texts.update(await self._texts(owner, lacking))
        return {memory_id: context.context(texts[memory_id], [*sides.before, *sides.after], texts)
                for memory_id, sides in around.items()
                if context.is_turn(texts.get(memory_id, ""))}

    async def _ids(self, owner: Owner) -> set[str]:
        """The ids the owner's index holds (a live view)."""
        ids: set[str] = await self._use(owner, attrgetter("ids"))
        return ids

    async def catch_up(self, owner: Owner, min_seq: int) -> Catalog:
        """The owner's catalog, holding every version up to `min_seq` at least, each one
        indexed (those storage still has)."""
        if (catalog := self._catalogs.current(owner, min_seq)) is not None:
            return catalog
        async with self._catalogs.lock(owner):
            return await self._catch_up(owner, min_seq)

    async def _catch_up(self, owner: Owner, min_seq: int) -> Catalog:
        """`catch_up` under the owner's lock."""
        if (catalog := self._catalogs.current(owner, min_seq)) is not None:
            return catalog
        catalog = self._catalogs.of(owner)
        rows = await self._storage.catalog(  # a loaded catalog lacks a few: their texts at once
            CatalogRequest(owner=owner, after_seq=catalog.seq, texts=catalog.loaded))
        # the catalog takes the rows (the turns' neighbours are found in it) but says it is
        # caught up only once their texts are indexed: a rank that finds the catalog caught up
        # (outside the lock) must find their words too
        indexed = await self._ids(owner)
        missing = [i for i in rows.memory_ids if i not in indexed]
        catalog.apply(rows, advance=False)
        if missing:
            if rows.texts is None:
                texts = await self._texts(owner, missing)
            else:
                texts = dict(zip(rows.memory_ids, rows.texts, strict=True))
            contexts = await self._contexts(owner, catalog, texts, missing)
            changed = [i for i in dict.fromkeys([*missing, *contexts]) if i in texts]
            items = [(i, texts[i]) for i in changed]
            await self._use(owner, lambda index: index.add(items, contexts))
            self._added.set()
        catalog.seq = max(catalog.seq, rows.high_seq)
        catalog.loaded = True
        self._catalogs.used(owner)
        return catalog

    async def remove(self, owner: Owner, deleted: list[str]) -> None:
        """Forget deleted versions; if the index held any, rebuild it without them (every
        context document computed again from the remaining versions)."""
        async with self._catalogs.lock(owner):
            catalog = self._catalogs.get(owner)
            if catalog is not None:
                catalog.remove(deleted)
            if (await self._ids(owner)).isdisjoint(deleted):
                return
            catalog = await self._catch_up(owner, 0)
            texts = await self._texts(owner, None)
            # versions the catalog does not hold yet are left to the next catch-up, which
            # indexes them with their contexts
            kept = [i for i in catalog.ids if i in texts]
            contexts = await self._contexts(owner, catalog, texts, kept)
            items = [(i, texts[i]) for i in kept]
            await self._use(owner, lambda index: index.rebuild(items, contexts))

    async def drop(self, payload: bytes) -> SubjectCount:
        """For an erasure: the versions gone from the catalog and the index files now."""
        request = parse(Drop, payload)
        held = (await self._ids(request.owner)).intersection(request.memory_ids)
        await self.remove(request.owner, request.memory_ids)
        return SubjectCount(count=len(held), node=fence.node())

    async def on_events(self, payloads: list[bytes]) -> None:
        stored, deleted = memory_changes(payloads)  # all read, before any work
        await asyncio.gather(*(self.catch_up(owner, seq) for owner, seq in stored.items()))
        for owner, ids in deleted.items():
            await self.remove(owner, ids)

    async def rank(self, payload: bytes) -> Ranking:
        request = parse(RankRequest, payload)
        owner = request.filters.owner
        catalog = await self.catch_up(owner, request.min_seq)
        mask = catalog.allowed(request.filters, request.exclude)
        ids = catalog.ids
        blocked_rows = np.flatnonzero(~mask)
        if len(blocked_rows) <= max(request.depth, request.context, SKIP_AT_MOST):
            # search all, skip those
            allowed = None
            blocked = {ids[row] for row in blocked_rows}
        else:
            allowed = [ids[row] for row in np.flatnonzero(mask)]
            blocked = set()

        def search(index: OwnerIndex) -> tuple[list[str], list[tuple[str, float]]]:
            ranked = index.rank(request.query, allowed, request.depth, blocked=blocked,
                                turns=not request.conversation)
            if not request.context:
                return ranked, []
            return ranked, index.rank_context(request.query, allowed, request.context,
                                              blocked=blocked)

        ranked, contextual = await self._use(owner, search)
        if not request.neighbours:
            return Ranking(memory_ids=ranked, context=contextual)
        mask = catalog.allowed(request.filters, request.exclude)  # the rows may have changed
        return Ranking(memory_ids=ranked, context=contextual,
                       neighbours=catalog.neighbours(ranked, mask, request.neighbours))

"""The embedder actor: one partition's memory vectors, and cosine ranking (SPEC §3.5).

Fed like the indexer by a durable pull consumer on `mem.evt.<p>.memory` (ids only; texts come
from storage). Query embeddings go through a batcher: requests that arrive while the model is
busy are handed to the model thread together (one hop; the model runs each text alone).

Each owner it ranks for has a `Catalog` whose rows carry the vectors: a recall's filters become
a mask, and the owner's whole matrix is scored by one matrix-vector product. A rank request
catches the catalog up to the owner's newest seq first (metadata only: a memory is found by
meaning once its vector exists, by its words at once).

Conversation turns (`policy/context.py`): the catalog marks them, with their speakers, from the
texts embedded (and, for the vectors of earlier runs, from the texts read when the owner's
catalog is loaded). A rank request for the conversation channel leaves them out of the cosine
list and ranks them by cosine smoothed along each namespace's turns, raised when the query names
their speaker, with those scores (the recall actor adds the context channel's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from pathlib import Path

import numpy as np

from memgate.cluster import fence
from memgate.bus import parse, subjects
from memgate.contracts.erasure import Drop, SubjectCount
from memgate.contracts.errors import UnavailableError
from memgate.contracts.events import memory_changes
from memgate.contracts.internal import (
    CatalogRequest, OwnedText, Owner, Ranking, RankRequest,
)
from memgate.embedding.batching import Batcher
from memgate.embedding.model import OnnxEmbedder
from memgate.observe import metrics
from memgate.policy import context
from memgate.ports.bus import Bus
from memgate.ports.storage import PartitionStorage
from memgate.runtime.catalogs import Catalogs
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Serial
from memgate.runtime.compaction import Compactions
from memgate.storage.catalog import Catalog
from memgate.storage.vectors import VectorStore
from memgate.tasks import cancelled

log = logging.getLogger("memgate.embedder")

# One ONNX thread: documents are embedded in the background, where CPU counts more than latency,
# and one thread costs less CPU per text (docs/experiments/embedding.md, "Figures quoted from
# the code").
MODEL_THREADS = 1
# Events handled at most per batch: when the consumer lags, each batch costs a few round trips to
# storage per owner and one model call, so bigger batches catch up faster (well within ack_wait).
EVENT_BATCH = 128
# Versions a rank embeds itself at most (read-your-writes): the few a recall just remembered,
# ~2 ms each; more means a backlog (a burst of remembers), which the recall does not wait for
# (it says `degraded: ["cosine"]`) and the events embed in the background.
URGENT_MAX = 8
# Vectors per write of the vectors file (and per batch a cluster ships to the standbys: ~2 KiB
# each as JSON, well below NATS's payload limit), and texts per step of an owner's backlog.
VECTOR_CHUNK = 256


class EmbedderActor(ActorBase):
    vectors = Opened[VectorStore]()
    _embedder = Opened[OnnxEmbedder]()
    _batcher = Opened[Batcher]()

    def __init__(self, *, partition: str, path: Path, model: Path, tokenizer: Path,
                 bus: Bus, batch: int = 32) -> None:
        self.partition = partition
        self.name = f"embedder.{partition}"
        self._path = path
        self._model = model
        self._tokenizer = tokenizer
        self._bus = bus
        self._storage = PartitionStorage(bus, partition)
        self._batch = batch
        self._model_thread = Serial(f"{self.name}.model", background=True)
        # a waiting recall's few versions, ahead of the backlog (one ONNX session, two threads)
        self._urgent_thread = Serial(f"{self.name}.urgent")
        # the writer of the vectors (named as the store: on a cluster, what it commits is
        # applied by the partition's standbys before it returns, `cluster.replication`)
        self._store_thread = Serial(self.name)
        self._backlogs: dict[Owner, asyncio.Task[None]] = {}
        # the newest version (its partition-wide seq) whose event was applied: a version at or
        # below it still without a vector gets it from no event (its file lost, or made again)
        self._evented = 0
        self._compactions = Compactions(self._store_thread, lambda: self.vectors,
                                        f"{self.name}.vectors")
        self._catalogs = Catalogs(lambda: Catalog(dim=self._embedder.dim))
        self._events = bus.consumer(subjects.memory_events(partition), f"embedder-{partition}",
                                    self.on_events, batch_size=EVENT_BATCH)
        self._backlog = metrics.EMBEDDING_BACKLOG.labels(partition)
        self._embedded_after = metrics.EMBEDDED_SECONDS.labels(partition)

    async def start(self) -> None:
        self._embedder = await self._model_thread(partial(
            OnnxEmbedder, self._model, self._tokenizer, threads=MODEL_THREADS))
        await self._model_thread(self._embedder.embed, ["warm up"])  # first run allocates
        self.vectors = await self._store_thread(VectorStore, self._path)
        self._batcher = Batcher(self._embedder, self._model_thread, self._batch)
        self._batcher.start()
        await self._events.start()

    async def stop(self) -> None:
        await self._events.stop()
        await cancelled(*self._backlogs.values())
        if EmbedderActor._batcher.opened(self):
            await self._batcher.stop()
        if (vectors := EmbedderActor.vectors.take(self)) is not None:
            await self._store_thread(vectors.close)
        self._model_thread.shutdown()
        self._urgent_thread.shutdown()
        self._store_thread.shutdown()

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(subjects.embed(self.partition, "rank"), self.rank, max_workers=64),
                Endpoint(subjects.embed(self.partition, "drop"), self.drop)]

    async def catch_up(self, owner: Owner, min_seq: int,
                       texts: dict[str, str] | None = None) -> Catalog:
        """The owner's catalog, holding every version up to `min_seq` at least (with the
        vectors already made; the others wait for `embed_missing`). `texts`, when given,
        receives those of the versions new to a loaded catalog, for `embed_missing`."""
        if (catalog := self._catalogs.current(owner, min_seq)) is not None:
            return catalog
        async with self._catalogs.lock(owner):
            if (catalog := self._catalogs.current(owner, min_seq)) is not None:
                return catalog
            catalog = self._catalogs.of(owner)
            rows = await self._storage.catalog(CatalogRequest(
                owner=owner, after_seq=catalog.seq, texts=texts is not None and catalog.loaded))
            catalog.apply(rows)
            if texts is not None and rows.texts is not None:
                texts.update(zip(rows.memory_ids, rows.texts, strict=True))
            if not catalog.loaded:  # the vectors made by earlier runs
                found, matrix = await self._store_thread(self.vectors.owner, owner.tenant,
                                                         owner.subject_id)
                if matrix is not None:
                    catalog.set_vectors(found, matrix)
                    embedded = await self._storage.texts(owner, found)
                    catalog.set_turns({item.memory_id: context.turn(item.text)
                                       for item in embedded})
            catalog.loaded = True
            self._catalogs.used(owner)
            return catalog

    async def embed_missing(self, catalogs: dict[Owner, Catalog],
                            at_hand: dict[Owner, dict[str, str]]) -> None:
        """Embed these owners' versions that have no vector yet (texts `at_hand`, else fetched
        from storage), in one hop to the model thread and one transaction: under load a batch
        of events spans many owners, and a hop and a transaction per owner would cost more."""
        wanted = {owner: (catalog, missing) for owner, catalog in catalogs.items()
                  if (missing := catalog.unembedded())}
        await self._embed(wanted, at_hand, self._model_thread)

    async def _embed(self, wanted: dict[Owner, tuple[Catalog, list[str]]],
                     at_hand: dict[Owner, dict[str, str]], thread: Serial) -> None:
        """Embed these versions on `thread`; each vector is kept once (a rank and the events
        may embed the same version meanwhile: the first to finish keeps its vector)."""
        if not wanted:
            return

        async def texts(owner: Owner, missing: list[str]) -> list[OwnedText]:
            held = at_hand.get(owner, {})
            if all(i in held for i in missing):
                return [OwnedText(memory_id=i, text=held[i]) for i in missing]
            return await self._storage.texts(owner, missing)

        replies = await asyncio.gather(*(texts(owner, missing)
                                         for owner, (_, missing) in wanted.items()))
        fetched = [(owner, catalog, items)
                   for (owner, (catalog, _)), items in zip(wanted.items(), replies, strict=True)
                   if items]
        if not fetched:
            return
        matrix = await thread(self._embedder.embed,
                              [item.text for _, _, items in fetched for item in items])
        kept, ids, owners, start = [], [], [], 0
        for owner, catalog, items in fetched:  # no await from here to the catalogs' update
            rows = matrix[start:start + len(items)]
            start += len(items)
            fresh = catalog.lacking([item.memory_id for item in items])
            items = [item for item, new in zip(items, fresh, strict=True) if new]
            catalog.set_vectors([item.memory_id for item in items], rows[np.asarray(fresh)])
            self._observe_embedded(catalog, [item.memory_id for item in items])
            catalog.set_turns({item.memory_id: context.turn(item.text) for item in items})
            kept.append(rows[np.asarray(fresh)])
            ids += [item.memory_id for item in items]
            owners += [(owner.tenant, owner.subject_id)] * len(items)
        matrix = np.vstack(kept)
        for at in range(0, len(ids), VECTOR_CHUNK):
            chunk = slice(at, at + VECTOR_CHUNK)
            await self._store_thread(self.vectors.put, ids[chunk], owners[chunk], matrix[chunk])

    def _observe_embedded(self, catalog: Catalog, memory_ids: list[str]) -> None:
        """`memgate_embedded_after_seconds`: from each version's commit to its vector."""
        now = time.time_ns() // 1000
        for created in catalog.created(memory_ids).tolist():
            self._embedded_after.observe(max(now - created, 0) / 1e6)

    async def on_events(self, payloads: list[bytes]) -> None:
        # the events in hand and those waiting behind them (`DurableConsumer.pending`)
        self._backlog.set(max(getattr(self._events, "pending", 0), len(payloads)))
        try:
            await self._on_events(payloads)
        finally:
            self._backlog.set(max(getattr(self._events, "pending", 0) - len(payloads), 0))

    async def _on_events(self, payloads: list[bytes]) -> None:
        stored, deleted = memory_changes(payloads)  # all read, before any work
        texts: dict[Owner, dict[str, str]] = {owner: {} for owner in stored}
        caught_up = await asyncio.gather(*(self.catch_up(owner, seq, texts[owner])
                                           for owner, seq in stored.items()))
        await self.embed_missing(dict(zip(stored, caught_up, strict=True)), texts)
        self._evented = max(self._evented, *stored.values(), 0)
        for owner, ids in deleted.items():
            await self._remove(owner, ids)
        await self._compactions.settled()  # acked (and so done) once the vectors left the file

    async def _remove(self, owner: Owner, ids: list[str]) -> int:
        """Delete these versions' vectors and forget them; how many vectors there were."""
        held = await self._store_thread(self.vectors.delete, ids)
        catalog = self._catalogs.get(owner)
        if catalog is not None:
            catalog.remove(ids)
        return held

    async def drop(self, payload: bytes) -> SubjectCount:
        """For an erasure: the versions' vectors gone now, from the file and from memory."""
        request = parse(Drop, payload)
        async with self._compactions.deleting():
            count = await self._remove(request.owner, request.memory_ids)
        return SubjectCount(count=count, node=fence.node())

    async def _embedded(self, owner: Owner, catalog: Catalog) -> None:
        """Read-your-writes by meaning (SPEC §3.5): every version the catalog holds has its
        vector before it is ranked; the few not embedded yet are embedded now, on a thread of
        their own ahead of the backlog. More than `URGENT_MAX` (a backlog) or a failure: no
        ranking, so the answer says `degraded: ["cosine"]`, never that it is complete."""
        missing = catalog.unembedded()
        if len(missing) > URGENT_MAX:
            if self._passed(catalog):  # else their events are coming
                self._embed_backlog(owner)
            raise UnavailableError("memories are still being embedded")
        await self._embed({owner: (catalog, missing)} if missing else {}, {}, self._urgent_thread)
        if catalog.unembedded():
            raise UnavailableError("some memories are not embedded yet")

    def _passed(self, catalog: Catalog) -> list[str]:
        """The versions without vectors that no event will bring: every one while no event
        waits, else those at or below the newest version an event brought."""
        if not getattr(self._events, "pending", 0):
            return catalog.unembedded()
        return catalog.unembedded(up_to=self._evented)

    def _embed_backlog(self, owner: Owner) -> None:
        """The owner's versions without vectors that no event will bring (`_passed`: the
        vectors file lost, or made again where a partition moved) embedded in the background,
        `VECTOR_CHUNK` at a time, unless that runs already: they are not left to the owner's
        next remember, nor to the end of the others' remembers. Not those whose events are
        coming: at saturation both embedded them, 40% more CPU per remember (docs/DECISIONS.md,
        "The vectors travel with the replica")."""
        if owner in self._backlogs:
            return

        async def embed() -> None:
            try:
                while (catalog := self._catalogs.get(owner)) is not None and (
                        missing := self._passed(catalog)):
                    await self._embed({owner: (catalog, missing[:VECTOR_CHUNK])}, {},
                                      self._model_thread)
                    if len(self._passed(catalog)) >= len(missing):  # texts gone meanwhile
                        return
            except Exception as exc:  # the next rank that finds it missing starts it again
                log.warning("%s: embedding a backlog failed (%s)", self.name, type(exc).__name__)
            finally:
                self._backlogs.pop(owner, None)

        self._backlogs[owner] = asyncio.create_task(embed(), name=f"{self.name}.backlog")

    async def rank(self, payload: bytes) -> Ranking:
        """The allowed versions that have vectors, by cosine similarity to the query (its
        vector when the caller sends one, else the query embedded here)."""
        request = parse(RankRequest, payload)
        catalog = await self.catch_up(request.filters.owner, request.min_seq)
        await self._embedded(request.filters.owner, catalog)
        if request.vector is not None:
            query = np.asarray(request.vector, dtype=np.float32)
        else:
            query = await self._batcher.embed(request.query)
        mask = catalog.allowed(request.filters, request.exclude)
        turns = catalog.turns() if request.conversation else None
        if turns is None or not turns.any():  # no conversation channel to rank
            ranked = catalog.nearest(query, mask, request.depth)
            return Ranking(memory_ids=ranked,
                           neighbours=catalog.neighbours(ranked, mask, request.neighbours))
        scores = catalog.similarities(query)
        ranked = catalog.best(scores, mask & ~turns, request.depth)
        smoothed = catalog.smoothed(scores, mask, context.smooth)
        smoothed += context.SPEAKER * catalog.named(request.query) + catalog.priors()
        return Ranking(memory_ids=ranked,
                       neighbours=catalog.neighbours(ranked, mask, request.neighbours),
                       smoothed=catalog.best_scored(smoothed, mask & turns, request.depth))

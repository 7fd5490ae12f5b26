"""The embedder actor: one partition's memory vectors, and cosine ranking (SPEC §3.5).

Fed like the indexer by a durable pull consumer on `mem.evt.<p>.memory` (ids only; texts come
from storage). Query embeddings go through a batcher: requests that arrive while the model is
busy are handed to the model thread together (one hop; the model runs each text alone).

Each owner it ranks for has a `Catalog` whose rows carry the vectors: a recall's filters become
a mask, and the owner's whole matrix is scored by one matrix-vector product. A rank request
catches the catalog up to the owner's newest seq first (metadata only: a memory is found by
meaning once its vector exists, by its words at once), then has the versions its filters allow
that have no vector yet embedded ahead of everything else (`embedding.lanes`: the urgent lane,
on a thread of its own) until its wait ends, and ranks without those still missing then,
saying how many (`Ranking.unembedded`: the recall reports the channel degraded). The
background (the events, a lost file's backlog) embeds small batches, each once no urgent
version waits.

Conversation turns (`policy/context.py`): the catalog marks them, with their speakers, from the
texts embedded (and, for the vectors of earlier runs, from the texts read when the owner's
catalog is loaded). A rank request for the conversation channel leaves them out of the cosine
list and ranks them by cosine smoothed along each namespace's turns, raised when the query names
their speaker, with those scores (the recall actor adds the context channel's).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from memgate.cluster import fence
from memgate.bus import parse, subjects
from memgate.contracts.erasure import Drop, SubjectCount
from memgate.contracts.events import memory_changes
from memgate.contracts.internal import (
    CatalogRequest, EmbedProgress, OwnedText, Owner, Ranking, RankRequest,
)
from memgate.embedding.batching import Batcher
from memgate.embedding.lanes import Lanes
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
# storage per owner and one write of the vectors, so bigger batches catch up faster (well within
# ack_wait).
EVENT_BATCH = 128
# Texts per model call in the background: a waiting recall's versions go first, and those it
# finds in the background's batch under way wait for that batch, so it is small; a hop to the
# model thread is cheap beside a text's run, so small batches cost the background little
# (measured: docs/DECISIONS.md, "Read-your-writes at any backlog").
BACKGROUND_BATCH = 4
# While this embedder answers a rank (a recall waits for it), the background model thread waits
# before its next batch, `YIELD_MAX_S` at most, so a burst's backlog takes no core from the
# recalls after it and drains at full speed whenever none comes (docs/DECISIONS.md, "A tail
# that does not remember the burst").
YIELD_MAX_S = 0.05
# Texts per model call in the urgent lane: a rank whose wait ends between two batches ranks
# with those already made, and another owner's rank waits for one batch at most.
URGENT_BATCH = 4
# Versions a rank asks the urgent lane for at most (their texts in one request): more than its
# wait embeds on this machine (~200); the rest is left to the background, as what its wait leaves.
URGENT_MAX = 256
# The background's vectors are written every this many, while the model goes on: written once
# per batch of events, the model waited ~12% of a drain for the writes (py-spy, issue 45).
WRITE_EVERY = 32
# The storage actor hears how far behind this embedder is after each model call and at least
# this often (`runtime.backpressure`: silent for 5 s, it is not waited on).
TELL_EVERY_S = 1.0
# Vectors per write of the vectors file (and per batch a cluster ships to the standbys: ~2 KiB
# each as JSON, well below NATS's payload limit), and texts per step of an owner's backlog.
VECTOR_CHUNK = 256


class EmbedderActor(ActorBase):
    vectors = Opened[VectorStore]()
    _embedder = Opened[OnnxEmbedder]()
    _batcher = Opened[Batcher]()

    def __init__(self, *, partition: str, path: Path, model: Path, tokenizer: Path,
                 bus: Bus, batch: int = 32, tells: bool = False) -> None:
        """`tells`: its backlog to the storage actor, whose remembers wait on it
        (`runtime.backpressure`, on when `MEMGATE_EMBEDDING_BACKLOG` is)."""
        self.partition = partition
        self.name = f"embedder.{partition}"
        self._tells = tells
        self._path = path
        self._model = model
        self._tokenizer = tokenizer
        self._bus = bus
        self._storage = PartitionStorage(bus, partition)
        self._batch = batch
        self._model_thread = Serial(f"{self.name}.model", background=True)
        # the urgent lane: the versions waiting recalls need (one ONNX session, two threads)
        self._urgent_thread = Serial(f"{self.name}.urgent")
        self._lanes: Lanes[_Text] = Lanes()
        self._urgent: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()  # the urgent lane's vectors to the file
        self._ranks = 0  # being answered, but those waiting for vectors
        self._unranked = threading.Event()  # none is: the background model thread may run
        self._unranked.set()
        # the writer of the vectors (named as the store: on a cluster, what it commits is
        # applied by the partition's standbys before it returns, `cluster.replication`)
        self._store_thread = Serial(self.name)
        self._backlogs: dict[Owner, asyncio.Task[None]] = {}
        # the newest version (its partition-wide seq) whose event was applied: a version at or
        # below it still without a vector gets it from no event (its file lost, or made again)
        self._evented = 0
        # the newest version an event brought: told to its storage actor with how many of the
        # versions of the events in hand are left to embed (`runtime.backpressure`)
        self._seen: int | None = None
        self._left = 0
        self._telling: asyncio.Task[None] | None = None
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
        # queries on the urgent thread: a rank waits for its query (the background yields)
        self._batcher = Batcher(self._embedder.embed, self._urgent_thread, self._batch)
        self._batcher.start()
        self._urgent = asyncio.create_task(self._urgent_lane(), name=f"{self.name}.urgent")
        if self._tells:
            self._telling = asyncio.create_task(self._keep_telling(),
                                                name=f"{self.name}.progress")
        await self._events.start()

    async def stop(self) -> None:
        self._lanes.close()  # the events' handler may wait for the urgent lane to be quiet
        await self._events.stop()
        await cancelled(self._urgent, self._telling, *self._backlogs.values())
        await asyncio.gather(*self._writes)
        if EmbedderActor._batcher.opened(self):
            await self._batcher.stop()
        if (vectors := EmbedderActor.vectors.take(self)) is not None:
            await self._store_thread.unreplicated(vectors.close)
        self._model_thread.shutdown()
        self._urgent_thread.shutdown()
        self._store_thread.shutdown()

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(subjects.embed(self.partition, "rank"), self.rank, max_workers=64),
                Endpoint(subjects.embed(self.partition, "drop"), self.drop)]

    async def catch_up(self, owner: Owner, min_seq: int,
                       texts: dict[str, str] | None = None) -> Catalog:
        """The owner's catalog, holding every version up to `min_seq` at least (with the
        vectors already made; the others wait for `embed_background`). `texts`, when given,
        receives those of the versions new to a loaded catalog, to embed them."""
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

    async def embed_background(self, wanted: dict[Owner, tuple[Catalog, list[str]]],
                               at_hand: dict[Owner, dict[str, str]], *,
                               told: bool = False) -> None:
        """Embed these versions (texts `at_hand`, else fetched from storage) in the background:
        `BACKGROUND_BATCH` texts a model call, each once no waiting recall's version is left
        to embed (`Lanes.quiet`); the vectors go to the file `WRITE_EVERY` at a time while the
        model goes on (on the store's thread), each write one transaction: under load a batch
        of events spans many owners, and a transaction per owner would cost more. `told`: the
        events' versions, whose progress the storage actor hears after each model call."""
        texts = await self._texts(wanted, at_hand)
        if told:
            await self._tell(len(texts))
        kept: list[_Kept] = []
        writes: list[asyncio.Task[None]] = []
        try:
            for at in range(0, len(texts), BACKGROUND_BATCH):
                await self._lanes.quiet()
                batch = [each for each in texts[at:at + BACKGROUND_BATCH]
                         if each[1].lacking([each[2].memory_id])[0]]
                claimed = set(self._lanes.claim([item.memory_id for _, _, item in batch]))
                batch = [each for each in batch if each[2].memory_id in claimed]
                try:
                    kept += await self._embed(batch, self._model_thread, self._yielding)
                finally:
                    self._lanes.done(list(claimed), urgent=False)
                if told:
                    await self._tell(max(len(texts) - at - BACKGROUND_BATCH, 0))
                if len(kept) >= WRITE_EVERY:
                    writes.append(asyncio.create_task(self._write(kept)))
                    kept = []
            await self._write(kept)
        finally:  # the events are acknowledged once their vectors are in the file
            await asyncio.gather(*writes)

    async def _texts(self, wanted: dict[Owner, tuple[Catalog, list[str]]],
                     at_hand: dict[Owner, dict[str, str]]) -> list[_Text]:
        """These versions' texts (`at_hand`, else from storage), with their owners and
        catalogs; the versions deleted meanwhile are left out."""

        async def texts(owner: Owner, missing: list[str]) -> list[OwnedText]:
            held = at_hand.get(owner, {})
            if all(i in held for i in missing):
                return [OwnedText(memory_id=i, text=held[i]) for i in missing]
            return await self._storage.texts(owner, missing)

        replies = await asyncio.gather(*(texts(owner, missing)
                                         for owner, (_, missing) in wanted.items()))
        return [(owner, catalog, item)
                for (owner, (catalog, _)), items in zip(wanted.items(), replies, strict=True)
                for item in items]

    async def _embed(self, batch: list[_Text], thread: Serial,
                     embed: Callable[[list[str]], np.ndarray] | None = None) -> list[_Kept]:
        """Embed these versions on `thread` (with `embed`, else the model's) and put their
        vectors in their catalogs (ranked from now on); each vector is kept once (the first
        made): those kept, to `_write`."""
        if not batch:
            return []
        matrix = await thread(embed or self._embedder.embed, [item.text for _, _, item in batch])
        kept = []
        for (owner, catalog, item), vector in zip(batch, matrix, strict=True):
            if catalog.lacking([item.memory_id])[0]:  # no await from here to the update
                catalog.set_vectors([item.memory_id], vector[None, :])
                catalog.set_turns({item.memory_id: context.turn(item.text)})
                self._observe_embedded(catalog, [item.memory_id])
                kept.append((owner, catalog, item.memory_id, vector))
        return kept

    async def _write(self, kept: list[_Kept]) -> None:
        """These vectors into the file, `VECTOR_CHUNK` a transaction: those of versions still
        held by their owner's current catalog when their chunk is sent (`_remove` forgets a
        version before it deletes its vector, so none deleted meanwhile comes back)."""
        for at in range(0, len(kept), VECTOR_CHUNK):
            chunk = [(owner, memory_id, vector)
                     for owner, catalog, memory_id, vector in kept[at:at + VECTOR_CHUNK]
                     if self._catalogs.get(owner) is catalog and catalog.embedded([memory_id])[0]]
            if chunk:  # no await from the check to the call's submission
                await self._store_thread(
                    self.vectors.put, [memory_id for _, memory_id, _ in chunk],
                    [(owner.tenant, owner.subject_id) for owner, _, _ in chunk],
                    np.vstack([vector for _, _, vector in chunk]))

    async def _urgent_lane(self) -> None:
        """Embed what waiting ranks ask for (`Lanes.ask`), `URGENT_BATCH` texts at a time, on
        the urgent thread; the ranks look again once their versions are in the catalogs, and
        the vectors go to the file meanwhile (`_write` leaves out any deleted since)."""
        while True:
            batch = await self._lanes.next_batch(URGENT_BATCH)
            kept: list[_Kept] = []
            try:
                kept = await self._embed([wanted.of for wanted in batch], self._urgent_thread)
            except Exception as exc:  # its ranks find the versions missing: degraded
                log.warning("%s: embedding for a recall failed (%s)", self.name,
                            type(exc).__name__)
            finally:
                self._lanes.done([wanted.memory_id for wanted in batch], urgent=True)
            if kept:
                write = asyncio.create_task(self._written(kept), name=f"{self.name}.write")
                self._writes.add(write)
                write.add_done_callback(self._writes.discard)

    def _yielding(self, texts: list[str]) -> np.ndarray:
        """On the background model thread: these texts' vectors, once no rank is being
        answered here (or `YIELD_MAX_S` later)."""
        self._unranked.wait(YIELD_MAX_S)
        return self._embedder.embed(texts)

    async def _written(self, kept: list[_Kept]) -> None:
        try:
            await self._write(kept)
        except Exception as exc:  # their versions lack vectors after a restart: made again
            log.warning("%s: writing vectors failed (%s)", self.name, type(exc).__name__)

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
        wanted = {owner: (catalog, missing) for owner, catalog in zip(stored, caught_up,
                                                                      strict=True)
                  if (missing := catalog.unembedded())}
        if stored:  # the catalogs caught up past the events, to the newest versions stored;
            # what is seen and what is left change together (no await between), or a word told
            # meanwhile (`_keep_telling`) would count the new versions as embedded
            self._seen = max(self._seen or 0, *stored.values(), *(c.seq for c in caught_up))
            self._left = sum(len(missing) for _, missing in wanted.values())
        try:
            await self.embed_background(wanted, texts, told=True)
        finally:
            await self._tell(0)
        self._evented = max(self._evented, *stored.values(), 0)
        for owner, ids in deleted.items():
            await self._remove(owner, ids)
        await self._compactions.settled()  # acked (and so done) once the vectors left the file

    async def _tell(self, left: int) -> None:
        """Tell the storage actor how far behind this embedder is (at most once: a lost word
        is replaced by the next, and a silent embedder holds no remember back)."""
        self._left = left
        if not self._tells:
            return
        try:
            await self._bus.publish(subjects.embedded(self.partition), EmbedProgress(
                seen=self._seen, left=left).model_dump(mode="json", by_alias=True))
        except Exception as exc:  # the connection closing: nothing to hold back
            log.debug("%s: progress not told (%s)", self.name, type(exc).__name__)

    async def _keep_telling(self) -> None:
        """Told every `TELL_EVERY_S` besides each model call: an embedder heard of is alive."""
        while True:
            await self._tell(self._left)
            await asyncio.sleep(TELL_EVERY_S)

    async def _remove(self, owner: Owner, ids: list[str]) -> int:
        """Forget these versions, then delete their vectors (in that order: `_write` sends only
        what a catalog holds); how many vectors there were."""
        catalog = self._catalogs.get(owner)
        if catalog is not None:
            catalog.remove(ids)
        held: int = await self._store_thread(self.vectors.delete, ids)
        return held

    async def drop(self, payload: bytes) -> SubjectCount:
        """For an erasure: the versions' vectors gone now, from the file and from memory."""
        request = parse(Drop, payload)
        async with self._compactions.deleting():
            count = await self._remove(request.owner, request.memory_ids)
        return SubjectCount(count=count, node=fence.node())

    async def _embedded(self, owner: Owner, catalog: Catalog, request: RankRequest,
                        until: float) -> None:
        """Read-your-writes by meaning (SPEC §3.5): the versions the request allows that have
        no vector yet jump every queue (the urgent lane) until `until`; those still missing
        then are ranked without, and the answer says how many, never that it is complete."""
        missing = catalog.unembedded(among=catalog.allowed(request.filters, request.exclude))
        if not missing:
            return
        if self._passed(catalog):  # what no event will bring, beyond this rank's wait
            self._embed_backlog(owner)
        asked = missing[:URGENT_MAX]
        if new := self._lanes.reserve(asked):  # the other ranks await them, their texts read once
            try:
                texts = await self._storage.texts(owner, new)
                self._lanes.ask({item.memory_id: (owner, catalog, item) for item in texts},
                                until)
            finally:
                self._lanes.release(new)  # those not asked for (deleted, or a failed read)
        if waits := self._lanes.futures(asked, until):
            self._answering(-1)  # some may be in the background's batch: it must not yield
            try:
                await asyncio.wait(waits,
                                   timeout=max(until - asyncio.get_running_loop().time(), 0))
            finally:
                self._answering(1)

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
                    await self.embed_background({owner: (catalog, missing[:VECTOR_CHUNK])}, {})
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
        self._answering(1)
        try:
            return await self._rank(payload)
        finally:
            self._answering(-1)

    def _answering(self, change: int) -> None:
        """Count the ranks being answered: while any is, the background yields."""
        self._ranks += change
        if self._ranks:
            self._unranked.clear()
        else:
            self._unranked.set()

    async def _rank(self, payload: bytes) -> Ranking:
        request = parse(RankRequest, payload)
        until = asyncio.get_running_loop().time() + request.wait_ms / 1000
        catalog = await self.catch_up(request.filters.owner, request.min_seq)
        await self._embedded(request.filters.owner, catalog, request, until)
        if request.vector is not None:
            query = np.asarray(request.vector, dtype=np.float32)
        else:
            query = await self._batcher.embed(request.query)
        mask = catalog.allowed(request.filters, request.exclude)
        unembedded = len(catalog.unembedded(among=mask))
        turns = catalog.turns() if request.conversation else None
        if turns is None or not turns.any():  # no conversation channel to rank
            ranked = catalog.nearest(query, mask, request.depth)
            return Ranking(memory_ids=ranked, unembedded=unembedded,
                           neighbours=catalog.neighbours(ranked, mask, request.neighbours))
        scores = catalog.similarities(query)
        ranked = catalog.best(scores, mask & ~turns, request.depth)
        smoothed = catalog.smoothed(scores, mask, context.smooth)
        smoothed += context.SPEAKER * catalog.named(request.query) + catalog.priors()
        return Ranking(memory_ids=ranked, unembedded=unembedded,
                       neighbours=catalog.neighbours(ranked, mask, request.neighbours),
                       smoothed=catalog.best_scored(smoothed, mask & turns, request.depth))


# A version's text on its way to the model, with its owner and catalog; a vector made, to write.
_Text = tuple[Owner, Catalog, OwnedText]
_Kept = tuple[Owner, Catalog, str, np.ndarray]

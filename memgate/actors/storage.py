"""The storage actor: the single writer of one partition's DuckDB file.

A remember is answered only after its transaction has committed. Events (ids only, never text)
are committed with the change they announce (a deletion's in an outbox table; a stored
version's is built from its row) and relayed to JetStream afterwards, so a crash between commit
and publish loses nothing: the relay resends on start, and the message id
(`<partition>-<seq>-<digest>`, `bus.streams.message_id`) makes resending harmless.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

from memgate.cluster import fence
from memgate.runtime.actor import ActorBase, Endpoint, Listener, Opened, Serial
from memgate.observe import metrics, tracing
from memgate.runtime.batching import GroupCommit
from memgate.runtime.backpressure import EmbeddingGate
from memgate.runtime.compaction import Compactions
from memgate.actors.keys import dumps
from memgate.bus import parse, subjects
from memgate.ports.bus import Consumers, Publisher
from memgate.bus.replies import Handler
from memgate.bus.streams import OutboxRelay, Pending
from memgate.contracts import (
    Contract, Failure, ForgetResult, ListResult, MemoriesDeleted, Memory, MemoryStored,
    RememberResult,
)
from memgate.contracts.errors import (
    MemgateError,     AgentMemoryFullError, NotFoundError, RateLimitedError, ValidationFailedError,
)
from memgate.contracts.events import (
    REGISTRY_EVENT, CollectionDeleted, DocumentDeleted, RegistryEvent, read_event,
)
from memgate.contracts.erasure import SubjectCount, SubjectTarget
from memgate.contracts.memory import Extras, ImportedMemory, ImportRefusal, ImportResult
from memgate.contracts.registry import Citation
from memgate.contracts.internal import (
    SPACE_OWNER_PREFIX, CatalogRequest, CatalogRows, OwnedText, Owner, RecallFilters,
    RecallScope, RememberedAll, Rows, RowsRequest, StoreForget, StorePurge, StoreQuery,
    StoreImport, StoreRemember, StoreRememberAll, Texts,
    TextsRequest,
)
from memgate.contracts.internal import EmbedProgress, Reaped, StoreReap
from memgate.storage import (
    Filters, LimitReachedError, Limits, MemoryStore, Remember, Row, Stored, decode_cursor,
    encode_cursor,
)
from memgate.storage.memory_rows import CatalogRow, naive
from memgate.storage.idempotency import Scoped

log = logging.getLogger("memgate.storage")
C = TypeVar("C")
R = TypeVar("R")

# Remembers taken in at once: those that arrive while a commit runs share the next one (at most
# GROUP_CAP); the others (list, forget, ...) are handled one at a time, in order.
GROUP_CAP = 128
REMEMBERS_AT_ONCE = 2 * GROUP_CAP
# The operations that delete answer only once the file is rewritten without the deleted rows
# (SPEC §5.4); taken in together, so that those arriving while one waits share its rewrite.
DELETIONS = frozenset({"forget", "purge", "subject", "reap"})
WRITES = DELETIONS | {"remember", "remember_all", "import"}  # what commits events for the relay
DELETIONS_AT_ONCE = 64


def citations_of(row: Row) -> list[Citation]:
    if not row.citations or row.citations == "[]":  # most memories cite nothing
        return []
    return [Citation.model_validate(c) for c in json.loads(row.citations)]


def _extras(extras: Extras | None) -> dict[str, Any]:
    """A mem0 memory's extras as stored (JSON), and its expiry: the start of its expiration
    date (UTC), which the reaper honours like the retention when sooner."""
    if extras is None:
        return {}
    expires = extras.expiration_date
    return {"extras": extras.model_dump_json(by_alias=True, exclude_none=True),
            "expires_at": None if expires is None else datetime.combine(expires, time())}


def _answer(stored: Stored, command: StoreRemember) -> RememberResult:
    """A remember's answer; a replay's is the first one (`Stored.replayed`)."""
    masked = json.loads(stored.masked) if stored.replayed and stored.masked else command.masked
    return RememberResult(memory_id=stored.memory_id, created_at=stored.created_at,
                          superseded=stored.superseded, masked=masked)


def memory_of(row: Row) -> Memory:
    return Memory(memory_id=row.memory_id, namespace=row.namespace, key=row.key, text=row.text,
                  collection_id=row.collection_id, created_at=row.created_at,
                  superseded_at=row.superseded_at, citations=citations_of(row),
                  extras=None if row.extras is None else Extras.model_validate_json(row.extras))


class StorageActor(ActorBase):
    store = Opened[MemoryStore]()

    def __init__(self, *, partition: str, path: Path, publisher: Publisher, bus: Consumers,
                 limits: Limits | None = None, partitions: int = 1,
                 embedding_backlog: int = 0) -> None:
        """`embedding_backlog`: remembers wait while the partition's embedder has that many
        versions left to embed (`runtime.backpressure`; 0: never)."""
        self.partition = partition
        self._partitions = partitions
        self._cascade = bus.consumer(subjects.registry_event(">"), f"storage-{partition}-cascade",
                                     self.on_registry_events)
        self._limits = limits or Limits()
        self.name = f"storage.{partition}"
        self._path = path
        self._serial = Serial(self.name)
        self._remembers = GroupCommit[Remember, Stored](self._serial, self._remember_group,
                                                        cap=GROUP_CAP, name=self.name)
        self._gate = EmbeddingGate(embedding_backlog)
        self._events_subject = subjects.memory_events(partition)
        self._dumps = dumps(self, self._serial)  # backups
        self._compactions = Compactions(self._serial, lambda: self.store, self.name)
        self._relay = OutboxRelay(publisher, prefix=partition, pending=self._pending_events,
                                  sent=self._events_sent)

    # Answers the in-memory mirror holds are given on the event loop (`MemoryStore.known_*`):
    # a hop to the writer's thread costs more than they do, and would wait behind a commit.

    async def _read(self, known: Callable[[], R | None], read: Callable[[], R]) -> R:
        """The mirror's answer, given on the event loop, when it holds one; else `read` of the
        file, on the writer's thread."""
        if (answer := known()) is not None:
            return answer
        return await self._serial(read)

    async def _pending_events(self) -> Pending:
        if (known := self.store.known_pending_events()) is not None:
            return known
        return await self._serial(self.store.pending_events)

    async def _events_sent(self, up_to_seq: int) -> None:
        if self.store.known_events_sent(up_to_seq):  # a batch of sent rows to delete
            await self._serial(self.store.events_sent, up_to_seq)

    async def start(self) -> None:
        self.store = await self._serial(partial(
            MemoryStore, self._path, event_subject=self._events_subject,
            stored_event=self._stored_event))
        await self._relay.start()  # resends whatever a previous run committed but did not publish
        await self._cascade.start()

    async def stop(self) -> None:
        await self._cascade.stop()
        await self._relay.stop()
        if (store := StorageActor.store.take(self)) is not None:
            await self._serial.unreplicated(store.close)
        self._serial.shutdown()

    def endpoints(self) -> list[Endpoint]:
        """A deletion answers once the file is rewritten (`_compacting`); remembers and
        deletions are taken in many at once, to share a commit or a rewrite."""
        answers: dict[str, Handler] = {
            "remember": self.remember, "remember_all": self.remember_all,
            "import": self.import_memories,
            "list": self.list_memories, "forget": self.forget,
            "scope": self.recall_scope, "rows": self.rows, "catalog": self.catalog,
            "texts": self.texts,
            "purge": self.purge, "subject": self.subject, "reap": self.reap,
        }
        at_once = {"remember": REMEMBERS_AT_ONCE} | dict.fromkeys(DELETIONS, DELETIONS_AT_ONCE)
        return [Endpoint(subjects.store(self.partition, operation),
                         self._wrapped(operation, handler), max_workers=at_once.get(operation, 1))
                for operation, handler in answers.items()] + self._dumps

    def listeners(self) -> dict[str, Listener]:
        if not self._gate.limit:  # nothing waits on the embedder
            return {}
        return {subjects.embedded(self.partition): self.embedder_progress}

    async def embedder_progress(self, payload: bytes) -> None:
        self._gate.heard(parse(EmbedProgress, payload))

    def _wrapped(self, operation: str, handler: Handler) -> Handler:
        """A write wakes the relay once it returns (its events are committed with it, SPEC
        §3.5), failed or not; a deletion then answers once its file is rewritten."""
        if operation in WRITES:
            handler = self._relaying(handler)
        return self._compacting(handler) if operation in DELETIONS else handler

    def _relaying(self, handler: Handler) -> Handler:
        async def relaying(payload: bytes) -> Contract:
            try:
                return await handler(payload)
            finally:
                self._relay.wake()

        relaying.__name__ = handler.__name__
        return relaying

    @staticmethod
    def _remember(command: StoreRemember, *,
                  rate: Literal["remembers", "imports"] | None = "remembers") -> Remember:
        """`rate`: the hourly limit that counts it (a bulk import's is a budget of its own; the
        operator's import has none)."""
        owner = command.owner
        return Remember(
            Filters(owner.tenant, owner.subject_id, command.namespace, command.key,
                    command.collection_id),
            memory_id=str(uuid.uuid4()), credential_id=command.credential_id,
            text=command.text, retention_days=command.retention_days,
            citations=tuple(c.model_dump(by_alias=True) for c in command.citations),
            derived_from=tuple(command.derived_from), member_id=command.member_id,
            rate=rate, idempotency=command.idempotency,
            created_at=None if command.created_at is None else naive(command.created_at),
            masked=json.dumps(command.masked), **_extras(command.extras))

    def _refusal(self, reached: LimitReachedError) -> MemgateError:
        if reached.limit == "imports":
            metrics.RATE_LIMITED.labels("importsPerHour").inc()
            return RateLimitedError(
                f"at most {self._limits.imports_per_hour} imported memories per hour per "
                "credential", {"retryAfterSeconds": reached.retry_after,
                               "limit": "importsPerHour"})
        if reached.retry_after is not None:
            metrics.RATE_LIMITED.labels("remembersPerHour").inc()
            return RateLimitedError(
                f"at most {self._limits.remembers_per_hour} remembers per hour per credential",
                {"retryAfterSeconds": reached.retry_after})
        return AgentMemoryFullError(
            f"at most {self._limits.versions_per_member} memory versions per member",
            {"limit": self._limits.versions_per_member})

    async def remember(self, payload: bytes) -> RememberResult:
        """Committed with whatever other remembers arrive meanwhile (group commit), answered
        after that commit."""
        command = parse(StoreRemember, payload)
        await self._gate.admit()  # the embedder's backlog bounded: a burst waits here
        stored: Stored | None = None
        try:
            with tracing.span("storage commit"):
                stored = await self._remembers(self._remember(command))
        except LimitReachedError as reached:
            raise self._refusal(reached) from None
        finally:
            self._gate.written(0 if stored is None else stored.seq)
        return _answer(stored, command)

    async def import_memories(self, payload: bytes) -> ImportResult:
        """A bulk import in one job of the writer (one transaction, one INSERT), each item
        stored or refused alone as a remember would be, counted by the import budget."""
        command = parse(StoreImport, payload)
        items = [self._remember(item, rate=None if command.operator else "imports")
                 for item in command.items]
        with tracing.span("storage commit"):
            outcomes = await self._serial(lambda: self.store.remember_group(items,
                                                                            self._limits))
        result = ImportResult()
        for index, (outcome, item) in enumerate(zip(outcomes, command.items, strict=True)):
            if isinstance(outcome, LimitReachedError):
                result.refused.append(ImportRefusal(
                    index=index, error=Failure.of(self._refusal(outcome)).error))
            elif isinstance(outcome, Exception):
                raise outcome
            else:
                result.stored.append(ImportedMemory(
                    index=index, **_answer(outcome, item).model_dump()))
        return result

    async def remember_all(self, payload: bytes) -> RememberedAll:
        """Versions committed together, or none of them if a limit refuses one."""
        command = parse(StoreRememberAll, payload)
        items = [self._remember(item) for item in command.items]
        await self._gate.admit(len(items))
        outcomes: list[Stored | Exception] = []
        try:
            outcomes = await self._serial(lambda: self.store.remember_group(
                items, self._limits, together=True))
        finally:
            self._gate.written(max((o.seq for o in outcomes if isinstance(o, Stored)),
                                   default=0), len(items))
        for outcome in outcomes:
            if isinstance(outcome, LimitReachedError):
                raise self._refusal(outcome) from None
            if isinstance(outcome, Exception):
                raise outcome
        return RememberedAll(results=[
            RememberResult(memory_id=o.memory_id, created_at=o.created_at,
                           superseded=o.superseded, masked=item.masked)
            for o, item in zip(outcomes, command.items, strict=True)
            if not isinstance(o, Exception)])

    def _stored_event(self, seq: int, tenant: str, subject_id: str, memory_id: str) -> bytes:
        return MemoryStored(partition=self.partition, owner=Owner(tenant=tenant,
                            subject_id=subject_id), memory_id=memory_id, seq=seq).to_json()

    def _remember_group(self, items: Sequence[Remember]) -> list[Stored | Exception]:
        return self.store.remember_group(items, self._limits)

    @staticmethod
    def _filters(query: StoreQuery) -> Filters:
        return Filters(query.owner.tenant, query.owner.subject_id, query.namespace, query.key,
                       query.collection_id,
                       None if query.collection_ids is None else tuple(query.collection_ids),
                       None if query.namespaces is None else tuple(query.namespaces),
                       keys=None if query.keys is None else tuple(query.keys))

    async def list_memories(self, payload: bytes) -> ListResult:
        query = parse(StoreQuery, payload)
        before: int | None = None
        snapshot = query.as_of or datetime.now(UTC)
        if query.cursor is not None:
            try:
                before, snapshot = decode_cursor(query.cursor)
            except ValueError:
                raise ValidationFailedError("the cursor is not valid",
                                            {"field": "cursor"}) from None
        rows = await self._serial(lambda: self.store.versions(
            self._filters(query), as_of=snapshot, limit=query.limit + 1, before_seq=before))
        page = rows[: query.limit]
        cursor = encode_cursor(page[-1].seq, snapshot) if len(rows) > query.limit else None
        return ListResult(memories=[memory_of(r) for r in page], next_cursor=cursor)

    @staticmethod
    def _recall_filters(filters: RecallFilters) -> Filters:
        return Filters(filters.owner.tenant, filters.owner.subject_id, filters.namespace, None,
                       filters.collection_id,
                       None if filters.collection_ids is None else tuple(filters.collection_ids),
                       None if filters.namespaces is None else tuple(filters.namespaces),
                       None if filters.memory_ids is None else frozenset(filters.memory_ids))

    async def recall_scope(self, payload: bytes) -> RecallScope:
        """For recall, before ranking: the owner's newest seq, how many versions the filters
        allow, and the citing ones among them (to verify). Ids and citations, never text."""
        filters = parse(RecallFilters, payload)
        owner = filters.owner
        if (known := self.store.known_scope(owner.tenant, owner.subject_id)) is not None:
            return RecallScope(high_seq=known, total=None, cited={})
        high, total, cited = await self._serial(lambda: self.store.recall_scope(
            self._recall_filters(filters), as_of=filters.as_of or datetime.now(UTC),
            window=filters.window))
        return RecallScope(high_seq=high, total=total, cited={
            memory_id: [Citation.model_validate(c) for c in json.loads(citations)]
            for memory_id, citations in cited})

    async def rows(self, payload: bytes) -> Rows:
        """The ranked head of a recall: those of the ids that still exist and still match."""
        request = parse(RowsRequest, payload)
        filters = request.filters
        as_of = filters.as_of or datetime.now(UTC)
        rows = await self._read(
            lambda: self.store.known_rows(self._recall_filters(filters), as_of=as_of,
                                          memory_ids=request.memory_ids),
            lambda: self.store.rows(self._recall_filters(filters), as_of=as_of,
                                    memory_ids=request.memory_ids))
        return Rows(memories=[memory_of(r) for r in rows])

    async def catalog(self, payload: bytes) -> CatalogRows:
        """An owner's versions above a seq, for the indexer's and embedder's catalogs (SPEC
        §3.5: each channel filters in its own index), with their texts when asked."""
        request = parse(CatalogRequest, payload)
        owner = request.owner

        def read() -> tuple[int, list[CatalogRow]]:
            return (self.store.high_seq(owner.tenant, owner.subject_id),
                    self.store.catalog(owner.tenant, owner.subject_id, request.after_seq,
                                       texts=request.texts))

        high, rows = await self._read(lambda: self.store.known_catalog(
            owner.tenant, owner.subject_id, request.after_seq, texts=request.texts), read)
        columns = zip(*rows, strict=True) if rows else ([] for _ in CatalogRow._fields)
        (memory_ids, seqs, namespaces, keys, collection_ids, created_at, superseded_at,
         legal_hold, texts) = (list(column) for column in columns)  # `CatalogRow`'s fields
        return CatalogRows(
            high_seq=high, memory_ids=memory_ids, seqs=seqs, namespaces=namespaces, keys=keys,
            collection_ids=collection_ids, created_at=created_at, superseded_at=superseded_at,
            legal_hold=legal_hold, texts=texts if request.texts else None)

    def _compacting(self, handler: Callable[[bytes], Awaitable[C]]
                    ) -> Callable[[bytes], Awaitable[C]]:
        """`handler`, answering once what it deleted has left the file: also when it failed
        or found nothing (`Compactions.settled`)."""
        async def compacting(payload: bytes) -> C:
            async with self._compactions.deleting():
                return await handler(payload)

        compacting.__name__ = handler.__name__
        return compacting

    def _delete(self, tenant: str, subject_id: str | None, **conditions: Any) -> list[str]:
        def event(owner: str, ids: list[str]) -> bytes:
            return MemoriesDeleted(partition=self.partition,
                                   owner=Owner(tenant=tenant, subject_id=owner),
                                   memory_ids=ids).to_json()

        return self.store.delete(tenant, subject_id, **conditions,
                                 event_subject=subjects.memory_events(self.partition), event=event)

    async def forget(self, payload: bytes) -> ForgetResult:
        command = parse(StoreForget, payload)
        answered = None if command.idempotency is None or command.member_id is None else \
            Scoped(command.owner.tenant, command.member_id, command.idempotency)

        def forget() -> int:  # on the writer's thread: the record read and written in order
            if answered is not None and (first := self.store.forgotten(answered)) is not None:
                return first
            return len(self._delete(
                command.owner.tenant, command.owner.subject_id, memory_id=command.memory_id,
                namespace=command.namespace, key=command.key,
                collection_ids=None if command.collection_ids is None
                else tuple(command.collection_ids), namespaces=command.namespaces,
                keys=command.keys, answered=answered))

        deleted = await self._serial(forget)
        if not deleted:
            raise NotFoundError("no such memory")
        return ForgetResult(deleted=deleted)

    async def on_registry_events(self, payloads: list[bytes]) -> None:
        """Deleting a cited document, or its collection, deletes the memories (SPEC §3.3)."""
        events: list[RegistryEvent] = [read_event(REGISTRY_EVENT, p) for p in payloads]
        try:
            for event in events:
                tenant = event.workspace_id
                if subjects.partition_of(tenant, self._partitions) != self.partition:
                    continue
                cascades: list[dict[str, Any]] = []
                if isinstance(event, DocumentDeleted):
                    cascades.append({"cited_documents": [event.document_id]})
                elif isinstance(event, CollectionDeleted):
                    cascades.append({"collection_ids": (event.collection_id,)})
                    if event.document_ids:
                        cascades.append({"cited_documents": event.document_ids})
                for conditions in cascades:
                    await self._serial(partial(self._delete, tenant, None, **conditions))
            await self._compactions.settled()  # acked (and so done) once the bytes are gone
        finally:
            self._relay.wake()

    async def purge(self, payload: bytes) -> ForgetResult:
        """Delete without reading: a member's own memories (all, or some ids), a space's, or
        every member's agent memories (the owner's bulk delete, SPEC §2.3: members' memory-space
        memories are not the owner's to delete). Only a count comes back."""
        command = parse(StorePurge, payload)
        everyone = SPACE_OWNER_PREFIX if command.subject_id is None else None
        deleted = await self._serial(lambda: self._delete(
            command.tenant, command.subject_id, memory_ids=command.memory_ids,
            not_owner_prefix=everyone))
        return ForgetResult(deleted=len(deleted))

    async def subject(self, payload: bytes) -> SubjectCount:
        """An erasure's memory-store layer (SPEC §5.2): a member's agent memories, or an end
        user's memories in the namespaces of the spaces that hold them; counted, or erased."""
        target = parse(SubjectTarget, payload)
        owners = ({target.member_id: None} if target.member_id is not None
                  else dict(target.owners))

        def sweep() -> dict[str, list[str]]:
            found = {owner: self._delete(target.tenant, owner, namespaces=namespaces)
                     if target.erase else self.store.held_by(target.tenant, owner, namespaces)
                     for owner, namespaces in owners.items()}
            # what was extracted from the subject's conversations, whoever else took part
            derived = self.store.derived_from_any(target.tenant, target.derived_from)
            for owner, ids in derived.items():
                more = (self._delete(target.tenant, owner, memory_ids=ids) if target.erase
                        else ids)
                found[owner] = list(dict.fromkeys([*found.get(owner, []), *more]))
            return found

        by_owner = await self._serial(sweep)
        ids = [i for found in by_owner.values() for i in found]
        return SubjectCount(count=len(ids), record_ids=ids, by_owner=by_owner,
                            node=fence.node())

    async def reap(self, payload: bytes) -> Reaped:
        """Retention (SPEC §3.9): what is past its `expires_at` or its workspace's retentionDays
        at the reaper's `now` goes, with what derives from it; legal holds stay. Done in this
        single writer's transaction, so reapers that race find nothing the second time."""
        command = parse(StoreReap, payload)
        cutoffs = {tenant: command.now - timedelta(days=days)
                   for tenant, days in command.retention_days.items()
                   if subjects.partition_of(tenant, self._partitions) == self.partition}

        def event(tenant: str, owner: str, ids: list[str]) -> bytes:
            return MemoriesDeleted(partition=self.partition,
                                   owner=Owner(tenant=tenant, subject_id=owner),
                                   memory_ids=ids).to_json()

        deleted = await self._serial(lambda: self.store.reap(
            command.now, cutoffs, event_subject=self._events_subject, event=event))
        return Reaped(deleted=len(deleted))

    async def texts(self, payload: bytes) -> Texts:
        """Masked texts for the indexer and embedder, which keep none of their own copies."""
        request = parse(TextsRequest, payload)
        owner = request.owner
        ids = request.memory_ids
        rows = await self._read(
            lambda: None if ids is None else self.store.known_texts(owner.tenant,
                                                                    owner.subject_id, ids),
            lambda: self.store.texts(owner.tenant, owner.subject_id, ids))
        return Texts(items=[OwnedText(memory_id=i, text=t) for i, t in rows])

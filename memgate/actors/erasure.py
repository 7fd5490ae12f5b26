"""The erasure actor: erasure requests from intake to evidence (SPEC §5.3).

It owns `DIR/erasure.duckdb` (single writer) and answers the operator's commands on
`mem.admin.erasure.*`. Nothing is resolved to a subject before identity is verified; tenant is
mandatory at every stage. Discovery and execution go through the registry of layers (§5.2): each
layer answers "what do you hold for this subject in this tenant?" and "erase it" on a subject of
its own (`SubjectTarget` → `SubjectCount`), so a new layer is one entry in `LAYERS`.
Execution runs in the background; `GET` shows its progress and evidence, never content.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Awaitable, Callable
from typing import NamedTuple
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from memgate.bus.subjects import Admin
from memgate.bus import parse, subjects
from memgate.contracts import Contract, Envelope
from memgate.contracts.backup import AuditAppend
from memgate.contracts.directory import MemberRequest
from memgate.contracts.erasure import (
    LAYERS, Decide, Drop, ErasureIntake, ErasureMetrics, ErasureRequests, ErasureView, Evidence,
    Status,
    SubjectCount, SubjectTarget, VerifyIdentity,
)
from memgate.contracts.errors import (
    ConflictError, MemgateError, NotFoundError,
)
from memgate.contracts.internal import Owner
from memgate.ports.bus import Requester
from memgate.ports.spaces import BusSpaces
from memgate.ports.directory import BusDirectory
from memgate.ports.ranking import BusRankers
from memgate.ports.services import BusAudit, BusKeys, BusSessions
from memgate.ports.storage import PartitionStorage
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Operator, Serial
from memgate.policy.masking import mask
from memgate.storage.erasure import ErasureStore, RequestRow

log = logging.getLogger("memgate.erasure")

DUE_AFTER = timedelta(days=30)  # GDPR Art. 12(3)
AUDIT_IDS_MAX = 10_000  # record ids per audit entry (AuditAppend's limit)
Clock = Callable[[], datetime]


Count = Callable[[SubjectTarget], Awaitable[SubjectCount]]


class Held(NamedTuple):
    """What one layer held of the subject, and the nodes that answered for it."""

    erased: int  # or found, when counting
    record_ids: list[str]
    nodes: list[str]

    @classmethod
    def of(cls, *answers: SubjectCount, count: SubjectCount | None = None) -> Held:
        counted = count or answers[0]
        return cls(counted.count, counted.record_ids,
                   sorted({a.node for a in answers if a.node is not None}))


NONE_HELD = Held(0, [], [])


@dataclass(frozen=True)
class Layer:
    """One layer of §5.2: who counts and erases what it holds, per partition (None: it holds
    nothing by design), and how its erasure works, for the evidence."""

    name: str
    holder: Callable[[str], Count] | None  # partition → its holder's count
    how: str


def _layers(bus: Requester, storage: Callable[[str], PartitionStorage]) -> dict[str, Layer]:
    keys, sessions = BusKeys(bus).subject, BusSessions(bus).subject
    return {layer.name: layer for layer in (
        Layer("memory_store", lambda p: storage(p).subject,
              "deleted in the partition's DuckDB file, then the file compacted"),
        Layer("vector_index", lambda p: storage(p).subject,
              "dropped by the indexer and the embedder before completion: the owner's Tantivy "
              "index rebuilt without them, their vectors deleted, their catalog rows forgotten"),
        Layer("conversation_logs", lambda p: sessions,
              "session events deleted, the file compacted"),
        Layer("traces_logs", None,
              "none held: memgate writes ids and error codes to its logs and traces, never "
              "content or identity (tests/test_error_logs.py)"),
        Layer("eval_exports", lambda p: keys, "crypto-shredded: the subject's data key erased"),
        Layer("backups", lambda p: keys, "crypto-shredded: the subject's data key erased"),
    )}


class ErasureActor(ActorBase):
    name = "erasure"
    store = Opened[ErasureStore]()

    def __init__(self, *, path: Path, bus: Requester, admin_token: Callable[[], str],
                 partitions: int = 1, now: Clock = lambda: datetime.now(UTC)) -> None:
        self._path = path
        self._directory = BusDirectory(bus)
        self._spaces = BusSpaces(bus)
        self._sessions = BusSessions(bus)
        self._audit = BusAudit(bus)
        self._rankers = BusRankers(bus, partitions=partitions)
        self._operator = Operator(admin_token)
        self._partitions = partitions
        self._now = now
        self._storage = {f"p{i}": PartitionStorage(bus, f"p{i}") for i in range(partitions)}
        self._layers = _layers(bus, self._storage.__getitem__)
        assert tuple(self._layers) == LAYERS
        self._serial = Serial("erasure")
        self._running: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._operator.load()
        self.store = await self._serial(ErasureStore, self._path)

    async def stop(self) -> None:
        for task in list(self._running):
            await asyncio.wait({task}, timeout=30)
        if (store := ErasureActor.store.take(self)) is not None:
            await self._serial.unreplicated(store.close)
        self._serial.shutdown()

    def endpoints(self) -> list[Endpoint]:
        stages: dict[str, Callable[[Envelope], Awaitable[Contract]]] = {
            Admin.ERASURE_CREATE: self.create, Admin.ERASURE_VERIFY: self.verify,
            Admin.ERASURE_DISCOVER: self.discover, Admin.ERASURE_DECIDE: self.decide,
            Admin.ERASURE_EXECUTE: self.execute, Admin.ERASURE_GET: self.get,
            Admin.ERASURE_METRICS: self.metrics, Admin.ERASURE_LIST: self.list_requests,
        }
        return [Endpoint(subject, self._operator.only(handler))
                for subject, handler in stages.items()]

    # --- stages ---

    async def _request(self, envelope: Envelope, *expected: Status) -> RequestRow:
        row = await self._serial(self.store.get, envelope.params.get("requestId", ""))
        if row is None:
            raise NotFoundError("no such erasure request")
        if expected and Status(row.status) not in expected:
            raise ConflictError(f"the request is {row.status}; this step needs it "
                                f"{' or '.join(s.value for s in expected)}",
                                {"status": row.status})
        return row

    async def create(self, envelope: Envelope) -> ErasureView:
        intake = parse(ErasureIntake, envelope.body)
        now = self._now()
        row = await self._serial(self.store.create, intake.workspace_id,
                                 intake.subject.member_id, intake.subject.external_id, now,
                                 now + DUE_AFTER)
        return self._view(row)

    async def verify(self, envelope: Envelope) -> ErasureView:
        row = await self._request(envelope, Status.RECEIVED)
        body = parse(VerifyIdentity, envelope.body)
        if row.member_id is not None:  # a member must exist in the request's workspace
            await self._directory.member(MemberRequest(workspace_id=row.workspace_id,
                                                       member_id=row.member_id))
        row.status, row.verified_at = Status.VERIFIED.value, self._now()
        row.verification_method, row.verified_by = body.method, body.verified_by
        await self._serial(self.store.save, row)
        return self._view(row)

    async def discover(self, envelope: Envelope) -> ErasureView:
        row = await self._request(envelope, Status.VERIFIED, Status.DISCOVERED)
        counts = await self._sweep(row, erase=False, holds=[])
        row.discovery = {layer: held.erased for layer, held in counts.items()}
        row.status = Status.DISCOVERED.value
        await self._serial(self.store.save, row)
        return self._view(row)

    async def decide(self, envelope: Envelope) -> ErasureView:
        row = await self._request(envelope, Status.DISCOVERED, Status.DECIDED)
        body = parse(Decide, envelope.body)
        row.holds, row.decision_reason = list(body.holds), mask(body.reason).text
        row.status = Status.DECIDED.value
        await self._serial(self.store.save, row)
        return self._view(row)

    async def execute(self, envelope: Envelope) -> ErasureView:
        row = await self._request(envelope, Status.DECIDED, Status.FAILED)  # FAILED: retry
        row.status, row.failure = Status.EXECUTING.value, None
        await self._serial(self.store.save, row)
        task = asyncio.create_task(self._execute(row))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return self._view(row)

    async def get(self, envelope: Envelope) -> ErasureView:
        return self._view(await self._request(envelope))

    async def list_requests(self, envelope: Envelope) -> ErasureRequests:
        rows = await self._serial(self.store.all)
        rows.sort(key=lambda r: r.received_at, reverse=True)
        return ErasureRequests(requests=[self._view(r) for r in rows])

    async def metrics(self, envelope: Envelope) -> ErasureMetrics:
        rows = await self._serial(self.store.all)
        now = self._now()
        open_rows = [r for r in rows if r.status not in (Status.COMPLETED, Status.FAILED)]
        days = [(now - r.received_at).total_seconds() / 86400 for r in open_rows]
        return ErasureMetrics(
            open=len(open_rows), overdue=sum(now > r.due_at for r in open_rows),
            completed=sum(r.status == Status.COMPLETED for r in rows),
            days_in_process_max=round(max(days, default=0.0), 3),
            days_in_process_median=round(statistics.median(days) if days else 0.0, 3))

    # --- the layers ---

    async def _target(self, row: RequestRow, *, erase: bool) -> SubjectTarget:
        """The verified subject in its tenant; an end user's memories are found through the
        spaces' entity map (which execution deletes last: it is the identity mapping)."""
        target = SubjectTarget(tenant=row.workspace_id, member_id=row.member_id,
                               external_id=row.external_id, erase=erase)
        if row.external_id is None:
            return target
        counting = target.model_copy(update={"erase": False})
        found = await self._spaces.subject(counting)
        logs = await self._sessions.subject(counting)
        return target.model_copy(update={"owners": found.owners,
                                         "derived_from": logs.record_ids})

    async def _sweep(self, row: RequestRow, *, erase: bool, holds: list[str],
                     done: Callable[[str, Held], Awaitable[None]] | None = None,
                     ) -> dict[str, Held]:
        """Ask every layer but those on hold; `done(layer, held)` after each."""
        target = await self._target(row, erase=erase)
        partition = subjects.partition_of(row.workspace_id, self._partitions)
        counts: dict[str, Held] = {}
        stored: dict[str, SubjectCount] = {}
        for layer in self._layers.values():
            if layer.name in holds:
                continue
            if layer.holder is None:
                counts[layer.name] = NONE_HELD
            elif layer.name == "vector_index":  # derived from the memory store's records
                counts[layer.name] = await self._vectors(
                    target, partition, stored.get("memory_store"))
            elif layer.name == "backups" and "eval_exports" in counts and erase:
                counts[layer.name] = counts["eval_exports"]  # one key shreds both
            else:
                answer = await layer.holder(partition)(target)
                stored[layer.name] = answer
                counts[layer.name] = Held.of(answer)
            if done is not None:
                await done(layer.name, counts[layer.name])
        if erase and row.external_id is not None:  # last: the identity mapping
            await self._spaces.subject(target)
        if erase and row.member_id is not None:
            await self._directory.forget_member(row.workspace_id, row.member_id)
        return counts

    async def _vectors(self, target: SubjectTarget, partition: str,
                       memories: SubjectCount | None) -> Held:
        """The BM25 and vector indexes hold what the memory store holds. Erasing, they drop
        the erased versions now (idempotent with the events that drop them too), so nothing of
        the subject is left in an index or a catalog in memory when the erasure completes."""
        if memories is None:  # the memory store is on hold: count only
            memories = await self._storage[partition].subject(
                target.model_copy(update={"erase": False}))
        if not target.erase:
            return Held(memories.count, memories.record_ids, [])
        dropped: list[SubjectCount] = []
        for owner, ids in memories.by_owner.items():  # gone from both once they answer
            drop = Drop(owner=Owner(tenant=target.tenant, subject_id=owner), memory_ids=ids)
            dropped += await self._rankers.drop(drop)
        return Held.of(*dropped, count=memories) if dropped else Held.of(memories)

    async def _execute(self, row: RequestRow) -> None:
        row.evidence = []

        async def done(layer: str, held: Held) -> None:
            count, record_ids = held.erased, held.record_ids
            row.evidence.append(Evidence(layer=layer, erased=count, at=self._now(),
                                         how=self._layers[layer].how,
                                         nodes=held.nodes).model_dump(mode="json"))
            await self._audit.append(AuditAppend(
                action="erasure.layer", actor=self.name, tenant=row.workspace_id,
                subject_id=self._reference(row), layer=layer, count=count,
                record_ids=record_ids[:AUDIT_IDS_MAX], source=row.request_id))
            await self._serial(self.store.save, row)  # progress, visible to `GET`

        try:
            await self._sweep(row, erase=True, holds=row.holds or [], done=done)
        except MemgateError as failure:
            log.warning("erasure %s failed: %s", row.request_id, failure.code)
            row.status, row.failure = Status.FAILED.value, failure.code.value
            await self._serial(self.store.save, row)
            return
        row.status, row.completed_at = Status.COMPLETED.value, self._now()
        row.member_id = row.external_id = None  # the identity goes with the data
        await self._serial(self.store.forget_identity, row)

    @staticmethod
    def _reference(row: RequestRow) -> str:
        """Whom the audit log names: a member by the internal id; an end user by the request,
        which forgets the external id it was given once it completes (SPEC §5.5)."""
        return row.member_id or f"erasure-request:{row.request_id}"

    @staticmethod
    def _view(row: RequestRow) -> ErasureView:
        return ErasureView(
            request_id=row.request_id, workspace_id=row.workspace_id, status=Status(row.status),
            received_at=row.received_at, due_at=row.due_at, verified_at=row.verified_at,
            verification_method=row.verification_method, discovery=row.discovery,
            holds=row.holds, decision_reason=row.decision_reason,
            evidence=[Evidence.model_validate(e) for e in row.evidence],
            completed_at=row.completed_at, failure=row.failure)

"""The actors other actors reach with one or two requests each, as those callers see them:
recall, the audit log, the keys, the sessions, space memories' extraction, the reaper, the
NATS authority and every file owner's backup dump. Each method is one request on the subject
its actor declares (`bus.subjects`); the actors with more to say have their own module."""

from __future__ import annotations

from memgate.bus import subjects
from memgate.contracts import Done, RecallResult
from memgate.contracts.backup import (
    AuditAppend, AuditAppended, DumpBegin, DumpPage, DumpRows, DumpTables,
)
from memgate.contracts.directory import NatsAgents
from memgate.contracts.erasure import SubjectCount, SubjectTarget
from memgate.contracts.internal import RecallQuery, Reaped
from memgate.contracts.sessions import ExtractRequest, Extracted, SpaceDeleted
from memgate.ports.bus import Requester


class BusRecall:
    """The recall actor (`mem.int.recall`), asked by governance and space memories."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def recall(self, query: RecallQuery) -> RecallResult:
        """The memories `query` finds, already governed (the caller masked its words)."""
        return await self._bus.request(subjects.recall_internal(), query, RecallResult)


class BusAudit:
    """The audit actor: one entry appended to the hash-chained log (references only)."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def append(self, entry: AuditAppend) -> AuditAppended:
        return await self._bus.request(subjects.AUDIT_APPEND, entry, AuditAppended)


class BusKeys:
    """The keys actor: a subject's data keys (what crypto-shreds exports and backups)."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def subject(self, target: SubjectTarget) -> SubjectCount:
        """The subject's keys, counted, or erased when `target.erase`."""
        return await self._bus.request(subjects.keys_internal("subject"), target, SubjectCount)


class BusSessions:
    """The sessions actor: an end user's conversation logs, and a deleted space's sessions."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def subject(self, target: SubjectTarget) -> SubjectCount:
        """The end user's session events, counted, or deleted when `target.erase`."""
        return await self._bus.request(subjects.sessions_internal("subject"), target,
                                       SubjectCount)

    async def space_deleted(self, deleted: SpaceDeleted) -> None:
        await self._bus.request(subjects.sessions_internal("space_deleted"), deleted, Done)


class BusExtraction:
    """Space memories' extraction: a session's events turned into memories by the LLM."""

    def __init__(self, bus: Requester, *, timeout_s: float) -> None:
        self._bus = bus
        self._timeout_s = timeout_s

    async def extract(self, request: ExtractRequest) -> Extracted:
        return await self._bus.request(subjects.space_memories_internal("extract"), request,
                                       Extracted, timeout=self._timeout_s)


class BusOperations:
    """What the directory has other actors do once settings change: the reaper sweep now
    (retention), the embedded nats-server reload its users (NATS agents)."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def sweep(self) -> Reaped:
        return await self._bus.request(subjects.REAPER_SWEEP, b"{}", Reaped, timeout=300)

    async def reload_nats(self, agents: NatsAgents) -> None:
        await self._bus.request(subjects.NATS_RELOAD, agents, Done)


class BusDumps:
    """Every file owner's backup dump (`actors.keys.dumps`), addressed by the owner's name."""

    def __init__(self, bus: Requester) -> None:
        self._bus = bus

    async def begin(self, owner: str, snapshot: str) -> DumpTables:
        return await self._bus.request(subjects.dump(owner, "begin"),
                                       DumpBegin(snapshot=snapshot), DumpTables)

    async def page(self, owner: str, page: DumpPage) -> DumpRows:
        return await self._bus.request(subjects.dump(owner, "page"), page, DumpRows)

    async def end(self, owner: str, snapshot: str) -> None:
        await self._bus.request(subjects.dump(owner, "end"), DumpBegin(snapshot=snapshot), Done)


__all__ = ["BusAudit", "BusDumps", "BusExtraction", "BusKeys", "BusOperations", "BusRecall",
           "BusSessions"]

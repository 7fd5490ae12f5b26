"""The sessions actor: chat-history sessions of memory spaces, their events, and the lifecycle
strategies that end them (SPEC §4.2, §4.3).

It owns `DIR/sessions.duckdb` (single writer). Every command carries a member token and asks
the spaces actor first (`mem.int.spaces.access`): reads need CAN_VIEW; creating sessions,
posting and editing events, and updating sessions need CAN_UPDATE; deleting needs CAN_DELETE.
Access is resolved afresh at every request, so a revoked share bites at once.

Sequence ids are issued on the worker thread (`Serial`), one command at a time, so concurrent
appends get 0, 1, 2… without gaps or duplicates; a batch is one DuckDB transaction. The same
turn checks the caller's quotas (sessions they created, events they posted: held, and made in
the last hour), so they hold exactly.

The lifecycle scheduler (`run_due`, every `interval_s`, with an injectable clock) runs the due
strategies: extract_memories first (the masked events go to `mem.int.spacemem.extract`; the
strategy counts as run only once that succeeded, else it is retried with exponential backoff),
then soft_delete (the session and its events leave every read at once). A soft_delete is not
held up by a failing extraction; an extraction that fell due before the session was hidden keeps
being retried from the hidden events until it succeeds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from memgate.cluster import fence
from memgate.actors.keys import dumps
from memgate.bus import parse, subjects
from memgate.contracts import Contract, Done, Envelope
from memgate.contracts.base import canonical_id
from memgate.contracts.erasure import SubjectCount, SubjectTarget
from memgate.contracts.errors import (
    NotFoundError, PreconditionFailedError, UnprocessableError, ValidationFailedError,
)
from memgate.contracts.sessions import (
    MAX_BATCH, OBJECT_ID, CreateSession, EditEvent, Emitter, EventBatch, EventIn, EventList,
    EventsQuery, EventView, ExtractEvent, ExtractRequest, LifecycleRun, NoBody,
    PatchSession, SessionView, SpaceDeleted, Strategy, Trigger,
)
from memgate.contracts.spaces import Permission, SpaceAccess
from memgate.policy import idempotency, lifecycle
from memgate.policy.authorisation import refuse_personal_data
from memgate.policy.conversation import extract_text, if_match, masked_body
from memgate.policy.masking import mask
from memgate.ports.bus import Requester
from memgate.ports.spaces import BusSpaces
from memgate.ports.services import BusExtraction
from memgate.runtime.actor import ActorBase, Endpoint, Opened, Serial, enveloped
from memgate.runtime.compaction import Compactions
from memgate.storage.quotas import EVENTS, SESSIONS, Quota
from memgate.storage.sessions import EventRow, NewEvent, SessionRow, SessionStore
from memgate.tasks import cancelled

log = logging.getLogger("memgate.sessions")

Clock = Callable[[], datetime]
Handler = Callable[[Envelope], Awaitable[Contract]]

REPLY_BUDGET_BYTES = 4 * 1024 * 1024  # event bodies in one reply (the bus carries 8 MiB)
TICK = timedelta(milliseconds=1)  # instants are kept to the millisecond, as JSON clients send them
DEFAULT_RULES = lifecycle.Rules()
_SEQUENCE = re.compile(r"^\d{1,15}$")
_OBJECT_ID = re.compile(OBJECT_ID)


def system_clock() -> datetime:
    return datetime.now(UTC)


def _ms(instant: datetime) -> datetime:
    return instant.replace(microsecond=instant.microsecond // 1000 * 1000)


def _masked_events(events: list[EventIn], batch: bool) -> list[NewEvent]:
    """Events as they are stored: bodies masked (SPEC §3.2); emitter ids and types and event
    types are names, never masked, so personal data in them is refused (as in a key). An
    emitter id that is an ObjectId, the form of a participant's id, is an id and kept."""
    new: list[NewEvent] = []
    for n, event in enumerate(events):
        at = f"events.{n}." if batch else ""
        emitter_id = None if _OBJECT_ID.match(event.emitter.id) else event.emitter.id
        refuse_personal_data(**{f"{at}emitter.type": event.emitter.type,
                                f"{at}emitter.id": emitter_id,
                                f"{at}eventType": event.event_type})
        new.append(NewEvent(event.emitter.type, event.emitter.id, event.event_type,
                            masked_body(event.body, f"{at}body" if batch else "body")))
    return new


def _strategy_json(strategy: Strategy) -> dict[str, Any]:
    return strategy.model_dump(mode="json", by_alias=True, exclude_none=True)


def _strategies(row: SessionRow) -> list[Strategy]:
    return [Strategy.model_validate(item) for item in row.strategies]


def _ran(row: SessionRow) -> dict[str, Trigger]:
    return {kind: Trigger.model_validate(run.trigger) for kind, run in row.runs.items()}


def _view(row: SessionRow) -> SessionView:
    runs = [LifecycleRun(type=kind, trigger=Trigger.model_validate(run.trigger),  # type: ignore[arg-type]
                         ran_at=run.ran_at) for kind, run in sorted(row.runs.items())]
    return SessionView(id=row.session_id, space_id=row.space_id,
                       participants=list(row.participants), description=row.description,
                       lifecycle_strategies=_strategies(row), lifecycle_runs=runs,
                       version=row.version, created_at=row.created_at, updated_at=row.updated_at,
                       last_event_at=row.last_event_at, event_count=row.next_seq)


def _event_view(event: EventRow) -> EventView:
    return EventView(sequence_id=event.sequence_id, body=json.loads(event.body),
                     emitter=Emitter(type=event.emitter_type, id=event.emitter_id),
                     event_type=event.event_type, created_at=event.created_at,
                     updated_at=event.updated_at)


@dataclass
class _Retry:
    attempts: int
    next_at: datetime


class SessionsActor(ActorBase):
    name = "sessions"
    store = Opened[SessionStore]()

    def __init__(self, *, path: Path, bus: Requester, rules: lifecycle.Rules = DEFAULT_RULES,
                 now: Clock = system_clock, interval_s: float | None = 60.0,
                 retry_s: float = 30.0, retry_max_s: float = 3600.0,
                 extract_timeout_s: float = 120.0,
                 purge_after_s: float = 30 * 24 * 3600,
                 quotas: tuple[Quota, Quota] = (SESSIONS, EVENTS)) -> None:
        """`quotas`: what each member may hold and make per hour, of sessions and of events."""
        self._path = path
        self._quotas = quotas
        self._bus = bus
        self._spaces = BusSpaces(bus)
        self._rules = rules
        self._now = now
        self._interval_s = interval_s
        self._retry_s, self._retry_max_s = retry_s, retry_max_s
        self._extraction = BusExtraction(bus, timeout_s=extract_timeout_s)
        self._purge_after = timedelta(seconds=purge_after_s)
        self._serial = Serial(self.name)
        self._dumps = dumps(self, self._serial)  # backups
        self._compactions = Compactions(self._serial, lambda: self.store, self.name)
        self._retries: dict[tuple[str, str], _Retry] = {}
        self._running = asyncio.Lock()
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        sessions, events = self._quotas
        self.store = await self._serial(partial(SessionStore, self._path, sessions=sessions,
                                                 events=events))
        if self._interval_s is not None:
            self._ticker = asyncio.create_task(self._tick(self._interval_s))

    async def stop(self) -> None:
        await cancelled(self._ticker)
        async with self._running:  # a run in progress finishes first
            if (store := SessionsActor.store.take(self)) is not None:
                await self._serial.unreplicated(store.close)
        self._serial.shutdown()

    def endpoints(self) -> list[Endpoint]:
        public: dict[str, Handler] = {
            "create": self.create, "get": self.get, "patch": self.patch, "delete": self.delete,
            "events.append": self.append, "events.list": self.events,
            "events.edit": self.edit,
        }
        return [*(Endpoint(subjects.space(f"sessions.{operation}"), enveloped(handler))
                  for operation, handler in public.items()),
                Endpoint(subjects.sessions_internal("subject"), self.subject),
                Endpoint(subjects.sessions_internal("space_deleted"), self.space_deleted),
                *self._dumps]

    def _clock(self) -> datetime:
        return _ms(self._now().astimezone(UTC))

    # --- who is calling, and which session ---

    async def _allowed(self, envelope: Envelope, permission: Permission) -> SpaceAccess:
        return await self._spaces.access(envelope, permission)

    def _visible(self, access: SpaceAccess, session_id: str) -> SessionRow:
        """On the worker thread: the session, if it is in the caller's space and not hidden."""
        row = self.store.session(session_id)
        if row is None or not row.visible or row.space_id != access.space_id:
            raise NotFoundError("no such session")
        return row

    # --- sessions ---

    async def create(self, envelope: Envelope) -> SessionView:
        access = await self._allowed(envelope, Permission.CAN_UPDATE)
        body = parse(CreateSession, envelope.body)
        strategies = (lifecycle.default_strategies() if body.lifecycle_strategies is None
                      else lifecycle.validate(body.lifecycle_strategies, rules=self._rules,
                                              has_llm=access.llm_model_name is not None))
        participants = list(dict.fromkeys(canonical_id(p) for p in body.participants))
        now = self._clock()
        expires = lifecycle.hidden_at(strategies, created_at=now, last_event_at=None)
        key_hash = idempotency.key_hash(envelope.params)  # a retry gets the session it made
        row = await self._serial(partial(
            self.store.create, access.space_id, access.workspace_id, participants,
            mask(body.description).text, [_strategy_json(s) for s in strategies], now, expires,
            created_by=access.member_id, session_id=None if key_hash is None else
            idempotency.keyed_id("ses", access.space_id, access.member_id, key_hash)))
        return _view(row)

    async def get(self, envelope: Envelope) -> SessionView:
        access = await self._allowed(envelope, Permission.CAN_VIEW)
        parse(NoBody, envelope.body)
        return _view(await self._serial(self._visible, access,
                                        envelope.params.get("sessionId", "")))

    async def patch(self, envelope: Envelope) -> SessionView:
        access = await self._allowed(envelope, Permission.CAN_UPDATE)
        body = parse(PatchSession, envelope.body)
        expected = if_match(envelope.params.get("ifMatch"))
        session_id = envelope.params.get("sessionId", "")
        now = self._clock()

        def apply() -> SessionRow:
            row = self._visible(access, session_id)
            if expected is not None and expected != row.version:
                raise PreconditionFailedError("the session changed since that version; re-read it",
                                              {"version": row.version})
            strategies = _strategies(row)
            if "lifecycle_strategies" in body.model_fields_set:
                strategies = lifecycle.validate(
                    body.lifecycle_strategies, rules=self._rules,
                    has_llm=access.llm_model_name is not None, current=strategies,
                    ran=_ran(row))
            description = (row.description if body.description is None
                           else mask(body.description).text)
            expires = lifecycle.hidden_at(strategies, created_at=row.created_at,
                                          last_event_at=row.last_event_at)
            return self.store.update(row, description=description,
                                     strategies=[_strategy_json(s) for s in strategies],
                                     now=max(now, row.updated_at), expires_at=expires)

        return _view(await self._serial(apply))

    async def delete(self, envelope: Envelope) -> Done:
        """The session and its events leave the disk (rows on legal hold are only hidden)."""
        access = await self._allowed(envelope, Permission.CAN_DELETE)
        parse(NoBody, envelope.body)
        expected = if_match(envelope.params.get("ifMatch"))
        session_id = envelope.params.get("sessionId", "")
        now = self._clock()

        def apply() -> None:
            row = self._visible(access, session_id)
            if expected is not None and expected != row.version:
                raise PreconditionFailedError("the session changed since that version; re-read it",
                                              {"version": row.version})
            self.store.delete(row, now)
            for kind in ("soft_delete", "extract_memories"):
                self._retries.pop((session_id, kind), None)

        async with self._compactions.deleting():  # also a try that finds nothing now
            await self._serial(apply)
        return Done()

    # --- events ---

    async def append(self, envelope: Envelope) -> Contract:
        """One event (→ the event), or `{events: [...]}` (→ all of them, in one transaction)."""
        access = await self._allowed(envelope, Permission.CAN_UPDATE)
        batch = "events" in envelope.body
        if batch:
            count = envelope.body["events"]
            if isinstance(count, list) and not 1 <= len(count) <= MAX_BATCH:
                raise UnprocessableError(f"a batch holds 1 to {MAX_BATCH} events",
                                         {"field": "events", "max": MAX_BATCH})
            events = parse(EventBatch, envelope.body).events
        else:
            events = [parse(EventIn, envelope.body)]
        new = await asyncio.to_thread(_masked_events, events, batch)  # CPU: off the loop
        session_id = envelope.params.get("sessionId", "")
        key_hash = idempotency.key_hash(envelope.params)
        now = self._clock()

        def apply() -> list[EventRow]:
            row = self._visible(access, session_id)
            if key_hash is not None and (first := self.store.appended(
                    session_id, access.member_id, key_hash, now)) is not None:
                return first  # a retry: its first answer, nothing written
            at = max(now, row.last_event_at or now)  # last_event_at never moves back
            expires = lifecycle.hidden_at(_strategies(row), created_at=row.created_at,
                                          last_event_at=at)
            return self.store.append(row, new, at, expires, member_id=access.member_id,
                                     key_hash=key_hash)[1]

        stored = await self._serial(apply)
        if not batch:
            return _event_view(stored[0])
        return EventList(events=[_event_view(event) for event in stored])

    async def events(self, envelope: Envelope) -> EventList:
        access = await self._allowed(envelope, Permission.CAN_VIEW)
        query = parse(EventsQuery, envelope.body)
        session_id = envelope.params.get("sessionId", "")

        def read() -> list[EventRow]:
            self._visible(access, session_id)
            return self.store.events(session_id, query.last_n)

        found = await self._serial(read)
        kept: list[EventRow] = []
        budget = REPLY_BUDGET_BYTES
        for event in reversed(found):  # the newest first, while they fit
            budget -= len(event.body) + 200
            if budget < 0:
                break
            kept.append(event)
        return EventList(events=[_event_view(event) for event in reversed(kept)],
                         truncated=len(kept) < len(found))

    async def edit(self, envelope: Envelope) -> EventView:
        """A new body; with `createdAt`, refused (412 PRECONDITION_FAILED) when the event was
        changed after that instant (its `updatedAt` is later): re-read, then retry."""
        access = await self._allowed(envelope, Permission.CAN_UPDATE)
        raw = envelope.params.get("sequenceId", "")
        if not _SEQUENCE.match(raw):
            raise ValidationFailedError("the request is not valid", {"problems": [
                {"field": "sequenceId", "problem": "must be a whole number from 0"}]})
        body = parse(EditEvent, envelope.body)
        masked = await asyncio.to_thread(masked_body, body.body)  # CPU: off the loop
        session_id = envelope.params.get("sessionId", "")
        now = self._clock()

        def apply() -> EventRow:
            row = self._visible(access, session_id)
            event = self.store.event(session_id, int(raw))
            if event is None:
                raise NotFoundError("no such event")
            if body.created_at is not None and event.updated_at > body.created_at:
                raise PreconditionFailedError(
                    "the event changed after createdAt; re-read it",
                    {"sequenceId": event.sequence_id,
                     "updatedAt": event.updated_at.isoformat().replace("+00:00", "Z")})
            return self.store.edit(row, event, masked, max(now, event.updated_at + TICK),
                                   member_id=access.member_id)

        async with self._compactions.deleting():  # the old body leaves the file's bytes
            edited = await self._serial(apply)
        return _event_view(edited)

    # --- erasure (SPEC §5.2, layer 3: conversation logs) ---

    async def subject(self, payload: bytes) -> SubjectCount:
        """What the conversation logs hold about an end user (a participant: `externalId`) in
        a tenant; with `erase`, their sessions and events are deleted (not those on legal
        hold). Members are never participants (participants are 24-hex ObjectIds)."""
        target = parse(SubjectTarget, payload)
        if target.external_id is None:
            return SubjectCount(count=0)
        subject_id = canonical_id(target.external_id)
        operation = self.store.erase_subject if target.erase else self.store.of_subject
        async with self._compactions.deleting():
            records = await self._serial(operation, target.tenant, subject_id)
        for record in records:
            for kind in ("soft_delete", "extract_memories"):
                self._retries.pop((record, kind), None)
        return SubjectCount(count=len(records), record_ids=records, node=fence.node())

    async def space_deleted(self, payload: bytes) -> Done:
        """A deleted space's sessions and events leave the disk (those on legal hold stay,
        hidden)."""
        gone = parse(SpaceDeleted, payload)
        now = self._clock()

        def apply() -> None:
            for row in self.store.of_space(gone.space_id):
                if row.tenant == gone.tenant:
                    self.store.delete(row, now)

        async with self._compactions.deleting():
            await self._serial(apply)
        return Done()

    # --- the lifecycle scheduler ---

    async def _tick(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.run_due()
            except Exception as exc:  # keep ticking; the reason's type only (no content)
                log.error("lifecycle run failed: %s", type(exc).__name__)

    def _due(self, now: datetime) -> list[tuple[str, Strategy]]:
        """On the worker thread: (session, strategy) pairs due now, not waiting for a retry."""
        found: list[tuple[str, Strategy]] = []
        for row in self.store.sessions():
            if row.legal_hold or not lifecycle.may_be_due(
                    row.strategies, row.runs, now=now, created_at=row.created_at,
                    last_event_at=row.last_event_at):  # legal hold: use is restricted
                continue
            ran = _ran(row)
            for strategy in lifecycle.due(_strategies(row), now=now, created_at=row.created_at,
                                          last_event_at=row.last_event_at, ran=ran):
                if not row.visible:  # only an extraction due before it was hidden remains
                    when = lifecycle.due_at(strategy.trigger, created_at=row.created_at,
                                            last_event_at=row.last_event_at)
                    assert row.hidden_at is not None
                    if strategy.type != "extract_memories" or when is None or \
                            when > row.hidden_at:
                        continue
                retry = self._retries.get((row.session_id, strategy.type))
                if retry is None or retry.next_at <= now:
                    found.append((row.session_id, strategy))
        return found

    async def run_due(self) -> list[tuple[str, str]]:
        """Run every strategy due at the clock's now; the (session id, type) pairs that ran."""
        async with self._running:
            if not SessionsActor.store.opened(self):
                return []
            now = self._clock()
            if await self._serial(self._purge_hidden, now):
                await self._compactions.settled()
            ran: list[tuple[str, str]] = []
            for session_id, strategy in await self._serial(self._due, now):
                if strategy.type == "soft_delete":
                    done = await self._serial(self._soft_delete, session_id, strategy, now)
                else:
                    done = await self._extract(session_id, strategy, now)
                if done:
                    ran.append((session_id, strategy.type))
            return ran

    def _purge_hidden(self, now: datetime) -> int:
        """Soft-deleted sessions leave the file `purge_after` after they were hidden (an
        extraction still retrying from their events keeps them until it ends)."""
        due = [row for row in self.store.sessions()
               if row.hidden_at is not None and not row.legal_hold
               and row.hidden_at + self._purge_after <= now
               and (row.session_id, "extract_memories") not in self._retries]
        for row in due:
            self.store.delete(row, now)
        return len(due)

    def _soft_delete(self, session_id: str, strategy: Strategy, now: datetime) -> bool:
        row = self.store.session(session_id)
        if row is None or not row.visible or strategy.type in row.runs:
            return False
        self.store.hide(row, now, (strategy.type, _strategy_json(strategy)["trigger"]))
        return True

    async def _extract(self, session_id: str, strategy: Strategy, now: datetime) -> bool:
        def read() -> tuple[SessionRow, list[EventRow]] | None:
            row = self.store.session(session_id)
            if row is None or strategy.type in row.runs:
                return None
            return row, self.store.all_events(session_id)

        found = await self._serial(read)
        if found is None:
            return False
        row, events = found
        if events:
            request = ExtractRequest(
                space_id=row.space_id, workspace_id=row.tenant, session_id=row.session_id,
                participants=list(row.participants), member_id=row.created_by,
                events=[ExtractEvent(sequence_id=e.sequence_id,
                                     text=extract_text(e.emitter_type, e.body))
                        for e in events])
            try:
                await self._extraction.extract(request)
            except Exception as exc:  # LLM down, timeout, malformed answer: later, again
                self._failed(session_id, strategy.type, now, exc)
                return False
        trigger = _strategy_json(strategy)["trigger"]

        def record() -> bool:
            current = self.store.session(session_id)
            if current is None:  # deleted meanwhile
                return False
            self.store.ran(current, strategy.type, trigger, now)
            return True

        self._retries.pop((session_id, strategy.type), None)
        return await self._serial(record)

    def _failed(self, session_id: str, kind: str, now: datetime, exc: Exception) -> None:
        previous = self._retries.get((session_id, kind))
        attempts = 1 if previous is None else previous.attempts + 1
        wait = lifecycle.backoff(attempts, base_s=self._retry_s, max_s=self._retry_max_s)
        self._retries[(session_id, kind)] = _Retry(attempts, now + timedelta(seconds=wait))
        log.warning("%s of session %s failed (%s); attempt %d, next in %.0f s", kind,
                    session_id, type(exc).__name__, attempts, wait)

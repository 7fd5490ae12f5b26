"""Sessions and their events (the conversation log of memory spaces, SPEC §4.2): a DuckDB file
owned by the sessions actor, which is its only writer. Session rows are mirrored in memory;
events are read from the file.

Every row carries the fields of SPEC §5.1: `tenant` (the workspace), `subject_ids` (the
session's participants: a conversation is about each of them, and erasure finds it by any),
`classification`, `derived_from`, `created_at`, `expires_at` (when soft_delete will hide it,
as known now; NULL when no strategy will), `legal_hold`. Event bodies are stored masked.
Instants are naive UTC in the file, aware UTC outside this module.

Sessions and events are per-member quotas (`storage.quotas`): a session names the member who
created it (`created_by`), an event the member who posted it (`member_id`); each member holds at
most so many of each, and makes at most so many of each in any hour (rows from before members
were kept count against no one).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memgate.storage import compaction
from memgate.storage.idempotency import KEPT
from memgate.storage.directory import new_id
from memgate.storage.quotas import EVENTS, SESSIONS, Key, Quota, Usage
from memgate.storage.transaction import transaction

CLASSIFICATION = "personal"  # a conversation log is personal data about its participants

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id     VARCHAR   PRIMARY KEY,
    space_id       VARCHAR   NOT NULL,
    tenant         VARCHAR   NOT NULL,  -- workspace id (SPEC §5.1)
    subject_ids    VARCHAR[] NOT NULL,  -- the participants
    description    VARCHAR   NOT NULL,  -- masked
    strategies     VARCHAR   NOT NULL,  -- JSON: [{type, trigger}]
    version        BIGINT    NOT NULL,
    next_seq       BIGINT    NOT NULL,  -- the sequenceId of the next event
    classification VARCHAR   NOT NULL,
    derived_from   VARCHAR[] NOT NULL,
    created_at     TIMESTAMP NOT NULL,
    updated_at     TIMESTAMP NOT NULL,
    last_event_at  TIMESTAMP,
    expires_at     TIMESTAMP,
    hidden_at      TIMESTAMP,            -- soft_delete ran (or deleted while on legal hold)
    legal_hold     BOOLEAN   NOT NULL,
    created_by     VARCHAR               -- the member who created it (their quota)
);
CREATE TABLE IF NOT EXISTS lifecycle_runs (
    session_id VARCHAR NOT NULL, type VARCHAR NOT NULL, trigger VARCHAR NOT NULL,
    ran_at TIMESTAMP NOT NULL, PRIMARY KEY (session_id, type)
);
CREATE TABLE IF NOT EXISTS events (
    session_id     VARCHAR   NOT NULL,
    sequence_id    BIGINT    NOT NULL,
    space_id       VARCHAR   NOT NULL,
    tenant         VARCHAR   NOT NULL,
    subject_ids    VARCHAR[] NOT NULL,
    emitter_type   VARCHAR   NOT NULL,
    emitter_id     VARCHAR   NOT NULL,
    event_type     VARCHAR   NOT NULL,
    body           VARCHAR   NOT NULL,  -- masked JSON
    classification VARCHAR   NOT NULL,
    derived_from   VARCHAR[] NOT NULL,
    created_at     TIMESTAMP NOT NULL,
    updated_at     TIMESTAMP NOT NULL,
    expires_at     TIMESTAMP,
    legal_hold     BOOLEAN   NOT NULL,
    member_id      VARCHAR,              -- the member who posted it (their quota)
    PRIMARY KEY (session_id, sequence_id)
);
-- an append's first answer under its poster's idempotency key (`idempotency.KEPT`)
CREATE TABLE IF NOT EXISTS idempotent_appends (
    session_id  VARCHAR   NOT NULL,
    member_id   VARCHAR   NOT NULL,
    key_hash    VARCHAR   NOT NULL,  -- SHA-256 hex of the caller's key, never the key
    first_seq   BIGINT    NOT NULL,  -- the events it stored: first_seq, first_seq + 1, ...
    count       INTEGER   NOT NULL,
    answered_at TIMESTAMP NOT NULL
);
"""

_SESSION_COLUMNS = ("session_id", "space_id", "tenant", "subject_ids", "description",
                    "strategies", "version", "next_seq", "classification", "derived_from",
                    "created_at", "updated_at", "last_event_at", "expires_at", "hidden_at",
                    "legal_hold", "created_by")
_EVENT_COLUMNS = ("sequence_id", "emitter_type", "emitter_id", "event_type", "body",
                  "created_at", "updated_at")
_APPENDED = ("session_id", "sequence_id", "space_id", "tenant", "subject_ids", "emitter_type",
             "emitter_id", "event_type", "body", "classification", "derived_from", "created_at",
             "updated_at", "expires_at", "legal_hold", "member_id")


def _naive(instant: datetime | None) -> datetime | None:
    return None if instant is None else instant.astimezone(UTC).replace(tzinfo=None)


def _utc(instant: datetime) -> datetime:
    return instant.replace(tzinfo=UTC)


def _aware(instant: datetime | None) -> datetime | None:
    return None if instant is None else _utc(instant)


@dataclass(frozen=True)
class Run:
    trigger: dict[str, Any]
    ran_at: datetime


@dataclass(frozen=True)
class SessionRow:
    session_id: str
    space_id: str
    tenant: str
    participants: tuple[str, ...]
    description: str
    strategies: tuple[dict[str, Any], ...]
    version: int
    next_seq: int
    created_at: datetime
    updated_at: datetime
    last_event_at: datetime | None = None
    expires_at: datetime | None = None
    hidden_at: datetime | None = None
    legal_hold: bool = False
    runs: dict[str, Run] = field(default_factory=dict)
    created_by: str | None = None  # None: a session from before creators were kept

    @property
    def visible(self) -> bool:
        return self.hidden_at is None


@dataclass(frozen=True)
class NewEvent:
    emitter_type: str
    emitter_id: str
    event_type: str
    body: str  # masked, compact JSON


@dataclass(frozen=True)
class EventRow:
    sequence_id: int
    emitter_type: str
    emitter_id: str
    event_type: str
    body: str
    created_at: datetime
    updated_at: datetime


def _event(values: Sequence[Any]) -> EventRow:
    row = dict(zip(_EVENT_COLUMNS, values, strict=True))
    row["created_at"], row["updated_at"] = _utc(row["created_at"]), _utc(row["updated_at"])
    return EventRow(**row)


class SessionStore(compaction.Rewritable):
    def __init__(self, path: Path, *, sessions: Quota = SESSIONS,
                 events: Quota = EVENTS) -> None:
        self._path = path
        self._db = compaction.open_owned(path, SCHEMA)
        for table, column in (("sessions", "created_by"), ("events", "member_id")):
            self._db.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} VARCHAR")
        self.deletions_pending = False
        runs: dict[str, dict[str, Run]] = {}
        for session_id, kind, trigger, ran_at in self._db.execute(
                "SELECT * FROM lifecycle_runs").fetchall():
            runs.setdefault(session_id, {})[kind] = Run(json.loads(trigger), _utc(ran_at))
        self._sessions: dict[str, SessionRow] = {}
        for values in self._db.execute(
                f"SELECT {', '.join(_SESSION_COLUMNS)} FROM sessions").fetchall():
            row = dict(zip(_SESSION_COLUMNS, values, strict=True))
            self._sessions[row["session_id"]] = SessionRow(
                session_id=row["session_id"], space_id=row["space_id"], tenant=row["tenant"],
                participants=tuple(row["subject_ids"]), description=row["description"],
                strategies=tuple(json.loads(row["strategies"])), version=row["version"],
                next_seq=row["next_seq"], created_at=_utc(row["created_at"]),
                updated_at=_utc(row["updated_at"]),
                last_event_at=_aware(row["last_event_at"]), expires_at=_aware(row["expires_at"]),
                hidden_at=_aware(row["hidden_at"]), legal_hold=row["legal_hold"],
                runs=runs.get(row["session_id"], {}), created_by=row["created_by"])
        self.sessions_usage = Usage(sessions, count=self._sessions_held,
                                    made=self._sessions_made)
        self.events_usage = Usage(events, count=self._events_held, made=self._events_made)

    def _sessions_held(self, key: Key) -> int:
        return sum(1 for row in self._sessions.values() if (row.tenant, row.created_by) == key)

    def _sessions_made(self, key: Key, since: datetime) -> list[tuple[datetime, int]]:
        return [(row.created_at, 1) for row in self._sessions.values()
                if (row.tenant, row.created_by) == key and row.created_at > since]

    def _events_held(self, key: Key) -> int:
        found = self._db.execute("SELECT count(*) FROM events WHERE tenant = ? AND member_id = ?",
                                 list(key)).fetchone()
        return int(found[0]) if found else 0

    def _events_made(self, key: Key, since: datetime) -> list[tuple[datetime, int]]:
        return [(_utc(at), count) for at, count in self._db.execute(
            "SELECT created_at, count(*) FROM events WHERE tenant = ? AND member_id = ? "
            "AND created_at > ? GROUP BY created_at", [*key, _naive(since)]).fetchall()]

    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()


    # --- sessions ---

    def session(self, session_id: str) -> SessionRow | None:
        return self._sessions.get(session_id)

    def sessions(self) -> list[SessionRow]:
        return list(self._sessions.values())

    def create(self, space_id: str, tenant: str, participants: Sequence[str], description: str,
               strategies: Sequence[dict[str, Any]], now: datetime,
               expires_at: datetime | None, *, created_by: str,
               session_id: str | None = None) -> SessionRow:
        """A session created by a member, within their quota (else MEMORY_SPACE_FULL or
        MEMORY_SPACE_RATE_LIMITED); under `session_id` if given, and that session if it exists
        (a create retried under its idempotency key: nothing written)."""
        if session_id is not None and (first := self._sessions.get(session_id)) is not None:
            return first
        self.sessions_usage.check((tenant, created_by), 1, now)
        row = SessionRow(session_id or new_id("ses"), space_id, tenant, tuple(participants),
                         description, tuple(strategies), 1, 0, now, now, expires_at=expires_at,
                         created_by=created_by)
        self._db.execute(
            f"INSERT INTO sessions ({', '.join(_SESSION_COLUMNS)}) VALUES "
            f"({', '.join('?' * len(_SESSION_COLUMNS))})",
            [row.session_id, space_id, tenant, list(participants), description,
             json.dumps(list(strategies)), 1, 0, CLASSIFICATION, [], _naive(now), _naive(now),
             None, _naive(expires_at), None, False, created_by])
        self._sessions[row.session_id] = row
        self.sessions_usage.took((tenant, created_by), 1, now)
        return row

    def update(self, row: SessionRow, *, description: str, strategies: Sequence[dict[str, Any]],
               now: datetime, expires_at: datetime | None) -> SessionRow:
        """New fields and version + 1; the events' `expires_at` follows the session's."""
        new = replace(row, description=description, strategies=tuple(strategies),
                      version=row.version + 1, updated_at=now, expires_at=expires_at)
        with transaction(self._db):
            self._db.execute(
                "UPDATE sessions SET description = ?, strategies = ?, version = ?, "
                "updated_at = ?, expires_at = ? WHERE session_id = ?",
                [description, json.dumps(list(strategies)), new.version, _naive(now),
                 _naive(expires_at), row.session_id])
            self._db.execute("UPDATE events SET expires_at = ? WHERE session_id = ?",
                             [_naive(expires_at), row.session_id])
        self._sessions[row.session_id] = new
        return new

    def hide(self, row: SessionRow, now: datetime, run: tuple[str, dict[str, Any]] | None
             ) -> SessionRow:
        """Gone from every read at once (soft_delete, recorded as run when `run` is given)."""
        runs = dict(row.runs)
        with transaction(self._db):
            self._db.execute("UPDATE sessions SET hidden_at = ? WHERE session_id = ?",
                             [_naive(now), row.session_id])
            if run is not None:
                self._record(row.session_id, run[0], run[1], now)
                runs[run[0]] = Run(run[1], now)
        new = replace(row, hidden_at=now, runs=runs)
        self._sessions[row.session_id] = new
        return new

    def ran(self, row: SessionRow, kind: str, trigger: dict[str, Any], now: datetime
            ) -> SessionRow:
        self._record(row.session_id, kind, trigger, now)
        new = replace(row, runs={**row.runs, kind: Run(trigger, now)})
        self._sessions[row.session_id] = new
        return new

    def _record(self, session_id: str, kind: str, trigger: dict[str, Any], now: datetime) -> None:
        self._db.execute("INSERT OR REPLACE INTO lifecycle_runs VALUES (?, ?, ?, ?)",
                         [session_id, kind, json.dumps(trigger), _naive(now)])

    def delete(self, row: SessionRow, now: datetime) -> None:
        """The session and its events, from the file (`compact` takes them off the disk); rows
        on legal hold are hidden and kept."""
        with transaction(self._db):
            self._delete_rows([row.session_id])
            if row.legal_hold:
                self._db.execute("UPDATE sessions SET hidden_at = ? WHERE session_id = ?",
                                 [_naive(now), row.session_id])
        self.deletions_pending = True
        if row.legal_hold:
            self._sessions[row.session_id] = replace(row, hidden_at=now, runs={})
        else:
            del self._sessions[row.session_id]

    def _delete_rows(self, session_ids: list[str]) -> None:
        """Inside a transaction: these sessions, their events and runs (not rows on legal
        hold), the file marked for the rewrite that takes them off the disk; what their
        creators and posters hold is counted again on next use."""
        self.sessions_usage.stale((row.tenant, row.created_by) for session_id in session_ids
                                  if (row := self._sessions.get(session_id)) is not None)
        self.events_usage.stale(self._db.execute(
            "SELECT DISTINCT tenant, member_id FROM events WHERE list_contains(?, session_id)",
            [session_ids]).fetchall())
        for table in ("events", "lifecycle_runs", "idempotent_appends", "sessions"):
            hold = " AND NOT legal_hold" if table in ("events", "sessions") else ""
            self._db.execute(f"DELETE FROM {table} WHERE list_contains(?, session_id){hold}",
                             [session_ids])
        compaction.mark(self._db)

    def of_space(self, space_id: str) -> list[SessionRow]:
        return [row for row in self._sessions.values() if row.space_id == space_id]

    # --- events ---

    def appended(self, session_id: str, member_id: str, key_hash: str,
                 now: datetime) -> list[EventRow] | None:
        """The events the append first answered under this key of this member stored, as
        they are now (None: no append was answered under it within `KEPT`)."""
        found = self._db.execute(
            "SELECT first_seq, count FROM idempotent_appends WHERE session_id = ? AND "
            "member_id = ? AND key_hash = ? AND answered_at > ?",
            [session_id, member_id, key_hash, _naive(now - KEPT)]).fetchone()
        if found is None:
            return None
        first, count = found
        return [_event(values) for values in self._db.execute(
            f"SELECT {', '.join(_EVENT_COLUMNS)} FROM events WHERE session_id = ? "
            "AND sequence_id >= ? AND sequence_id < ? ORDER BY sequence_id",
            [session_id, first, first + count]).fetchall()]

    def append(self, row: SessionRow, events: Sequence[NewEvent], now: datetime,
               expires_at: datetime | None, *, member_id: str, key_hash: str | None = None,
               ) -> tuple[SessionRow, list[EventRow]]:
        """All of `events` in one transaction, numbered from the session's next sequenceId,
        or none of them; posted by a member, within their quota (else MEMORY_SPACE_FULL or
        MEMORY_SPACE_RATE_LIMITED); with the answer under the member's idempotency key
        (`key_hash`, `appended`)."""
        self.events_usage.check((row.tenant, member_id), len(events), now)
        first = row.next_seq
        stored = [EventRow(first + n, e.emitter_type, e.emitter_id, e.event_type, e.body, now,
                           now) for n, e in enumerate(events)]
        placeholders = ", ".join(["(" + ", ".join("?" * 16) + ")"] * len(stored))
        values: list[Any] = []
        for event in stored:
            values += [row.session_id, event.sequence_id, row.space_id, row.tenant,
                       list(row.participants), event.emitter_type, event.emitter_id,
                       event.event_type, event.body, CLASSIFICATION, [], _naive(now),
                       _naive(now), _naive(expires_at), row.legal_hold, member_id]
        with transaction(self._db):
            self._db.execute(f"INSERT INTO events ({', '.join(_APPENDED)}) VALUES {placeholders}",
                             values)
            self._db.execute(
                "UPDATE sessions SET next_seq = ?, last_event_at = ?, expires_at = ? "
                "WHERE session_id = ?",
                [first + len(stored), _naive(now), _naive(expires_at), row.session_id])
            if expires_at != row.expires_at:  # an idle trigger moved it for every event
                self._db.execute("UPDATE events SET expires_at = ? WHERE session_id = ?",
                                 [_naive(expires_at), row.session_id])
            if key_hash is not None:
                self._db.execute(
                    "DELETE FROM idempotent_appends WHERE answered_at <= ?",
                    [_naive(now - KEPT)])
                self._db.execute("INSERT INTO idempotent_appends VALUES (?, ?, ?, ?, ?, ?)",
                                 [row.session_id, member_id, key_hash, first, len(stored),
                                  _naive(now)])
        new = replace(row, next_seq=first + len(stored), last_event_at=now,
                      expires_at=expires_at)
        self._sessions[row.session_id] = new
        self.events_usage.took((row.tenant, member_id), len(stored), now)
        return new, stored

    def events(self, session_id: str, last_n: int) -> list[EventRow]:
        """The newest `last_n` events not on legal hold, oldest first."""
        rows = self._db.execute(
            f"SELECT {', '.join(_EVENT_COLUMNS)} FROM events WHERE session_id = ? "
            "AND NOT legal_hold ORDER BY sequence_id DESC LIMIT ?",
            [session_id, last_n]).fetchall()
        return [_event(values) for values in reversed(rows)]

    def all_events(self, session_id: str) -> list[EventRow]:
        rows = self._db.execute(
            f"SELECT {', '.join(_EVENT_COLUMNS)} FROM events WHERE session_id = ? "
            "AND NOT legal_hold ORDER BY sequence_id", [session_id]).fetchall()
        return [_event(values) for values in rows]

    def event(self, session_id: str, sequence_id: int) -> EventRow | None:
        found = self._db.execute(
            f"SELECT {', '.join(_EVENT_COLUMNS)} FROM events WHERE session_id = ? "
            "AND sequence_id = ? AND NOT legal_hold", [session_id, sequence_id]).fetchone()
        return None if found is None else _event(found)

    def edit(self, row: SessionRow, event: EventRow, body: str, now: datetime, *,
             member_id: str) -> EventRow:
        """The old body leaves the file's bytes with the next `compact` (like a deletion). An
        edit is one of the member's events of the hour (it rewrites the file), not one more
        held (else MEMORY_SPACE_RATE_LIMITED)."""
        self.events_usage.check((row.tenant, member_id), 1, now, held=0)
        with transaction(self._db):
            self._db.execute("UPDATE events SET body = ?, updated_at = ? WHERE session_id = ? "
                             "AND sequence_id = ?",
                             [body, _naive(now), row.session_id, event.sequence_id])
            compaction.mark(self._db)
        self.deletions_pending = True
        self.events_usage.took((row.tenant, member_id), 1, now, held=0)
        return replace(event, body=body, updated_at=now)

    # --- erasure (SPEC §5.2, layer 3): what is held about a participant ---

    def of_subject(self, tenant: str, subject_id: str) -> list[str]:
        """The ids of the records about `subject_id` in `tenant`, legal holds left out: its
        sessions (`<sessionId>`) and their events (`<sessionId>/<sequenceId>`)."""
        sessions = sorted(row.session_id for row in self._sessions.values()
                          if row.tenant == tenant and subject_id in row.participants
                          and not row.legal_hold)
        if not sessions:
            return []
        events = self._db.execute(
            "SELECT session_id, sequence_id FROM events WHERE tenant = ? AND "
            "list_contains(subject_ids, ?) AND NOT legal_hold ORDER BY ALL",
            [tenant, subject_id]).fetchall()
        return sessions + [f"{session_id}/{sequence_id}" for session_id, sequence_id in events]

    def erase_subject(self, tenant: str, subject_id: str) -> list[str]:
        """Delete every session of `subject_id` in `tenant`, with its events (not those on
        legal hold): the ids of what was deleted."""
        erased = self.of_subject(tenant, subject_id)
        sessions = [record for record in erased if "/" not in record]
        if not sessions:
            return []
        with transaction(self._db):
            self._delete_rows(sessions)
        self.deletions_pending = True
        for session_id in sessions:
            del self._sessions[session_id]
        return erased

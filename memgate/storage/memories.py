"""The memory store of one partition: a DuckDB file owned by exactly one storage actor."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from memgate.storage import outbox

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    memory_id      VARCHAR   NOT NULL,
    seq            BIGINT    NOT NULL,
    tenant         VARCHAR   NOT NULL,  -- workspace id (SPEC §5.1)
    subject_id     VARCHAR   NOT NULL,  -- the member the memory belongs to
    credential_id  VARCHAR   NOT NULL,
    namespace      VARCHAR   NOT NULL,
    key            VARCHAR,
    collection_id  VARCHAR,
    text           VARCHAR   NOT NULL,  -- masked text only
    classification VARCHAR   NOT NULL,
    derived_from   VARCHAR[] NOT NULL,
    created_at     TIMESTAMP NOT NULL,  -- UTC
    superseded_at  TIMESTAMP,
    expires_at     TIMESTAMP NOT NULL,
    legal_hold     BOOLEAN   NOT NULL,
    citations      VARCHAR   DEFAULT '[]'  -- JSON: passage, document, version, sha256
);
CREATE TABLE IF NOT EXISTS remember_log (  -- for the hourly rate limit; forget does not erase it
    credential_id VARCHAR   NOT NULL,
    remembered_at TIMESTAMP NOT NULL
);
"""

_COLUMNS = ("memory_id, seq, namespace, key, collection_id, text, created_at, superseded_at, "
            "citations")


@dataclass(frozen=True)
class Row:
    memory_id: str
    seq: int
    namespace: str
    key: str | None
    collection_id: str | None
    text: str
    created_at: datetime
    superseded_at: datetime | None
    citations: str  # JSON


@dataclass(frozen=True)
class Stored:
    memory_id: str
    seq: int
    created_at: datetime
    superseded: int


@dataclass(frozen=True)
class Limits:
    remembers_per_hour: int = 120  # per credential
    versions_per_member: int = 5000  # per member and workspace, every version counted


class LimitReachedError(Exception):
    """A remember refused by a limit; `retry_after` seconds for the rate limit, else None."""

    def __init__(self, limit: str, retry_after: int | None = None) -> None:
        super().__init__(limit)
        self.limit = limit
        self.retry_after = retry_after


@dataclass(frozen=True)
class Filters:
    tenant: str
    subject_id: str
    namespace: str | None = None
    key: str | None = None
    collection_id: str | None = None
    collection_ids: tuple[str, ...] | None = None  # any of these (a context set)


def _naive(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(tzinfo=None)


def _aware(instant: datetime | None) -> datetime | None:
    return None if instant is None else instant.replace(tzinfo=UTC)


def encode_cursor(seq: int, snapshot: datetime) -> str:
    raw = json.dumps({"s": seq, "t": _naive(snapshot).isoformat()}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, datetime]:
    """Raises ValueError on anything that is not a cursor this store issued."""
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        seq, snapshot = data["s"], datetime.fromisoformat(data["t"]).replace(tzinfo=UTC)
    except (KeyError, TypeError, ValueError) as exc:  # JSON, base64, Unicode and date errors
        raise ValueError("not a cursor") from exc
    if type(seq) is not int or not 0 <= seq < 2**63:  # a BIGINT: no float, bool or 10**40
        raise ValueError("not a cursor")
    return seq, snapshot


class MemoryStore:
    """Synchronous DuckDB access; the storage actor serialises calls onto one thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = duckdb.connect(str(path))
        self._db.execute(_SCHEMA)
        self._db.execute("ALTER TABLE memories ADD COLUMN IF NOT EXISTS citations VARCHAR "
                         "DEFAULT '[]'")  # data directories from before citations
        highest, last = self._one("SELECT coalesce(max(seq), 0), max(created_at) FROM memories")
        outbox.create(self._db, floor=highest)  # seq never repeats: events' ids come from it
        self._last_created: datetime = last or datetime.min

    def _one(self, sql: str, params: list[Any] | None = None) -> tuple[Any, ...]:
        """The single row an aggregate query returns."""
        row = self._db.execute(sql, params or []).fetchone()
        assert row is not None, "an aggregate returns one row"
        return row

    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()

    def _next(self) -> tuple[int, datetime]:
        """A fresh sequence number (inside the caller's transaction) and a creation instant
        later than every earlier one."""
        now = max(datetime.now(UTC).replace(tzinfo=None),
                  self._last_created + timedelta(microseconds=1))
        self._last_created = now
        return outbox.next_seq(self._db), now

    def _check_limits(self, filters: Filters, credential_id: str, now: datetime,
                      limits: Limits) -> None:
        """Counted in the partition's single writer, so they hold however many governance
        processes there are."""
        db = self._db
        hour_ago = now - timedelta(hours=1)
        db.execute("DELETE FROM remember_log WHERE credential_id = ? AND remembered_at <= ?",
                   [credential_id, hour_ago])
        recent, oldest = self._one(
            "SELECT count(*), min(remembered_at) FROM remember_log WHERE credential_id = ?",
            [credential_id])
        if recent >= limits.remembers_per_hour:
            raise LimitReachedError("rate", max(1, int((oldest - hour_ago).total_seconds()) + 1))
        versions = self._one("SELECT count(*) FROM memories WHERE tenant = ? AND subject_id = ?",
                             [filters.tenant, filters.subject_id])[0]
        if versions >= limits.versions_per_member:
            raise LimitReachedError("versions")

    def remember(self, filters: Filters, *, memory_id: str, credential_id: str, text: str,
                 retention_days: int, event_subject: str, event: Callable[[int], bytes],
                 limits: Limits = Limits(),
                 citations: list[dict[str, Any]] | None = None) -> Stored:
        """Check the limits, insert a version, supersede the live one of the same key, queue
        the event: one transaction."""
        db = self._db
        db.begin()
        try:
            self._check_limits(filters, credential_id, datetime.now(UTC).replace(tzinfo=None),
                               limits)
            seq, now = self._next()
            db.execute("INSERT INTO remember_log VALUES (?, ?)", [credential_id, now])
            superseded = 0
            if filters.key is not None:
                superseded = len(db.execute(
                    "UPDATE memories SET superseded_at = ? WHERE tenant = ? AND subject_id = ? "
                    "AND namespace = ? AND key = ? AND superseded_at IS NULL RETURNING seq",
                    [now, filters.tenant, filters.subject_id, filters.namespace, filters.key],
                ).fetchall())
            db.execute(
                "INSERT INTO memories (memory_id, seq, tenant, subject_id, credential_id, "
                "namespace, key, collection_id, text, classification, derived_from, created_at, "
                "superseded_at, expires_at, legal_hold, citations) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'personal', ?, ?, NULL, ?, false, ?)",
                [memory_id, seq, filters.tenant, filters.subject_id, credential_id,
                 filters.namespace, filters.key, filters.collection_id, text,
                 [c["passageId"] for c in citations or []], now,
                 now + timedelta(days=retention_days), json.dumps(citations or [])],
            )
            db.execute("INSERT INTO outbox VALUES (?, ?, ?)", [seq, event_subject, event(seq)])
            db.commit()
        except BaseException:
            db.rollback()
            raise
        return Stored(memory_id=memory_id, seq=seq, created_at=now.replace(tzinfo=UTC),
                      superseded=superseded)

    def _where(self, filters: Filters, as_of: datetime) -> tuple[str, list[Any]]:
        clauses = ["tenant = ?", "subject_id = ?", "legal_hold = false", "created_at <= ?",
                   "(superseded_at IS NULL OR superseded_at > ?)"]
        instant = _naive(as_of)
        params: list[Any] = [filters.tenant, filters.subject_id, instant, instant]
        for column in ("namespace", "key", "collection_id"):
            value = getattr(filters, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if filters.collection_ids is not None:
            clauses.append("list_contains(?, collection_id)")
            params.append(list(filters.collection_ids))
        return " AND ".join(clauses), params

    def versions(self, filters: Filters, *, as_of: datetime, limit: int,
             before_seq: int | None = None) -> list[Row]:
        """Versions current at `as_of`, newest first."""
        where, params = self._where(filters, as_of)
        if before_seq is not None:
            where += " AND seq < ?"
            params.append(before_seq)
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM memories WHERE {where} ORDER BY seq DESC LIMIT ?",
            [*params, limit],
        ).fetchall()
        return [Row(r[0], r[1], r[2], r[3], r[4], r[5], r[6].replace(tzinfo=UTC), _aware(r[7]),
                    r[8]) for r in rows]

    def high_seq(self, tenant: str, subject_id: str) -> int:
        """The seq of the owner's newest version (0: none). Channels that have applied it have
        every version the owner has."""
        return int(self._one("SELECT coalesce(max(seq), 0) FROM memories "
                             "WHERE tenant = ? AND subject_id = ?", [tenant, subject_id])[0])

    def recall_scope(self, filters: Filters, *, as_of: datetime,
                     window: int | None) -> tuple[int, int | None, list[tuple[str, str]]]:
        """For recall: the owner's highest seq; the versions among those the filters allow
        (the newest `window` of them at most) that cite anything, (memory id, citations JSON);
        and, only when some do (some may be hidden), how many versions the filters allow."""
        where, params = self._where(filters, as_of)
        allowed = f"SELECT memory_id, citations, seq FROM memories WHERE {where}"
        limited = params
        if window is not None:
            allowed += " ORDER BY seq DESC LIMIT ?"
            limited = [*params, window]
        cited = self._db.execute(f"SELECT memory_id, citations FROM ({allowed}) "
                                 "WHERE citations <> '[]' ORDER BY seq DESC", limited).fetchall()
        if not cited:
            return self.high_seq(filters.tenant, filters.subject_id), None, []
        high, total = self._one(
            f"SELECT coalesce(max(seq), 0), count(*) FILTER (WHERE {where}) FROM memories "
            "WHERE tenant = ? AND subject_id = ?", [*params, filters.tenant, filters.subject_id])
        total = int(total) if window is None else min(int(total), window)
        return int(high), total, [(r[0], r[1]) for r in cited]

    def rows(self, filters: Filters, *, as_of: datetime, memory_ids: list[str]) -> list[Row]:
        """Those of `memory_ids` that exist and that the filters allow at `as_of`."""
        where, params = self._where(filters, as_of)
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM memories WHERE {where} AND memory_id = ANY(?)",
            [*params, memory_ids]).fetchall()
        return [Row(r[0], r[1], r[2], r[3], r[4], r[5], r[6].replace(tzinfo=UTC), _aware(r[7]),
                    r[8]) for r in rows]

    def catalog(self, tenant: str, subject_id: str, after_seq: int) -> list[tuple[Any, ...]]:
        """The owner's versions above `after_seq`, oldest first, without text: (memory_id,
        seq, namespace, key, collection_id, created_at, superseded_at, legal_hold)."""
        rows = self._db.execute(
            "SELECT memory_id, seq, namespace, key, collection_id, created_at, superseded_at, "
            "legal_hold FROM memories WHERE tenant = ? AND subject_id = ? AND seq > ? "
            "ORDER BY seq", [tenant, subject_id, after_seq]).fetchall()
        return [(*r[:5], r[5].replace(tzinfo=UTC), _aware(r[6]), r[7]) for r in rows]

    def delete(self, tenant: str, subject_id: str | None = None, *, memory_id: str | None = None,
               namespace: str | None = None, key: str | None = None,
               memory_ids: list[str] | None = None,
               collection_ids: tuple[str, ...] | None = None,
               cited_documents: list[str] | None = None, event_subject: str,
               event: Callable[[str, list[str]], bytes]) -> list[str]:
        """Hard-delete the versions that match every given condition (none: the whole tenant),
        except those on legal hold; one event per owner, in the same transaction."""
        clauses = ["tenant = ?", "legal_hold = false"]
        params: list[Any] = [tenant]
        for column, value in (("subject_id", subject_id), ("memory_id", memory_id),
                              ("namespace", namespace), ("key", key)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        for column, values in (("memory_id", memory_ids), ("collection_id", collection_ids)):
            if values is not None:
                clauses.append(f"list_contains(?, {column})")
                params.append(list(values))
        if cited_documents is not None:
            clauses.append("list_has_any(json_extract_string(citations, '$[*].documentId'), ?)")
            params.append(cited_documents)
        db = self._db
        db.begin()
        try:
            rows = db.execute(f"DELETE FROM memories WHERE {' AND '.join(clauses)} "
                              "RETURNING subject_id, memory_id", params).fetchall()
            by_owner: dict[str, list[str]] = {}
            for owner, deleted in rows:
                by_owner.setdefault(owner, []).append(deleted)
            for owner, ids in by_owner.items():
                outbox.queue(db, event_subject, event(owner, ids))
            db.commit()
        except BaseException:
            db.rollback()
            raise
        return [deleted for _, deleted in rows]

    def texts(self, tenant: str, subject_id: str,
              memory_ids: list[str] | None) -> list[tuple[str, str]]:
        sql = "SELECT memory_id, text FROM memories WHERE tenant = ? AND subject_id = ?"
        params: list[Any] = [tenant, subject_id]
        if memory_ids is not None:
            sql += " AND list_contains(?, memory_id)"
            params.append(memory_ids)
        return [(r[0], r[1]) for r in self._db.execute(sql + " ORDER BY seq", params).fetchall()]

    def pending_events(self, limit: int = 500) -> outbox.Pending:
        return outbox.pending(self._db, limit)

    def events_sent(self, up_to_seq: int) -> None:
        outbox.sent(self._db, up_to_seq)


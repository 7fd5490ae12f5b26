"""Erasure requests and their evidence: a DuckDB file owned by the erasure actor.

A request keeps the identity it names (a member id or an end user's external id) only until it
is executed: completion replaces it with nothing, so this file does not become a second copy
of the subject ↔ identity mapping (SPEC §5.5).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memgate.storage import compaction
from memgate.storage.directory import new_id
from memgate.storage.transaction import transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS erasure_requests (
    request_id VARCHAR PRIMARY KEY, workspace_id VARCHAR NOT NULL,
    member_id VARCHAR, external_id VARCHAR,
    status VARCHAR NOT NULL, received_at TIMESTAMP NOT NULL, due_at TIMESTAMP NOT NULL,
    verified_at TIMESTAMP, verification_method VARCHAR, verified_by VARCHAR,
    discovery VARCHAR, holds VARCHAR, decision_reason VARCHAR, evidence VARCHAR NOT NULL,
    completed_at TIMESTAMP, failure VARCHAR
);
"""

_FIELDS = ("request_id", "workspace_id", "member_id", "external_id", "status", "received_at",
           "due_at", "verified_at", "verification_method", "verified_by", "discovery", "holds",
           "decision_reason", "evidence", "completed_at", "failure")
_JSON = frozenset({"discovery", "holds", "evidence"})


def _naive(instant: datetime | None) -> datetime | None:
    return None if instant is None else instant.astimezone(UTC).replace(tzinfo=None)


@dataclass
class RequestRow:
    request_id: str
    workspace_id: str
    member_id: str | None
    external_id: str | None
    status: str
    received_at: datetime
    due_at: datetime
    verified_at: datetime | None = None
    verification_method: str | None = None
    verified_by: str | None = None
    discovery: dict[str, int] | None = None
    holds: list[str] | None = None
    decision_reason: str | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list)
    completed_at: datetime | None = None
    failure: str | None = None


class ErasureStore:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._db = compaction.open_owned(path, _SCHEMA)

    def close(self) -> None:
        self._db.execute("CHECKPOINT")
        self._db.close()

    def create(self, workspace_id: str, member_id: str | None, external_id: str | None,
               received_at: datetime, due_at: datetime) -> RequestRow:
        row = RequestRow(new_id("er"), workspace_id, member_id, external_id, "received",
                         received_at, due_at)
        self.save(row, insert=True)
        return row

    def save(self, row: RequestRow, *, insert: bool = False) -> None:
        values: list[Any] = []
        for name in _FIELDS:
            value = getattr(row, name)
            if name in _JSON:
                value = None if value is None else json.dumps(value)
            elif isinstance(value, datetime):
                value = _naive(value)
            values.append(value)
        if insert:
            marks = ", ".join("?" for _ in _FIELDS)
            self._db.execute(f"INSERT INTO erasure_requests VALUES ({marks})", values)
        else:
            sets = ", ".join(f"{name} = ?" for name in _FIELDS[1:])
            self._db.execute(f"UPDATE erasure_requests SET {sets} WHERE request_id = ?",
                             [*values[1:], row.request_id])

    def forget_identity(self, row: RequestRow) -> None:
        """Save `row`, whose identity the caller cleared, and rewrite the file so that the
        identity it named is in none of its bytes (`storage.compaction`)."""
        with transaction(self._db):
            self.save(row)
            compaction.mark(self._db)
        self._db = compaction.rewrite(self._db, self._path)

    def get(self, request_id: str) -> RequestRow | None:
        found = self._db.execute(
            f"SELECT {', '.join(_FIELDS)} FROM erasure_requests WHERE request_id = ?",
            [request_id]).fetchone()
        return None if found is None else self._row(found)

    def all(self) -> list[RequestRow]:
        return [self._row(found) for found in self._db.execute(
            f"SELECT {', '.join(_FIELDS)} FROM erasure_requests").fetchall()]

    @staticmethod
    def _row(values: tuple[Any, ...]) -> RequestRow:
        data = dict(zip(_FIELDS, values, strict=True))
        for name in _JSON:
            data[name] = None if data[name] is None else json.loads(data[name])
        for name in ("received_at", "due_at", "verified_at", "completed_at"):
            if data[name] is not None:
                data[name] = data[name].replace(tzinfo=UTC)
        return RequestRow(**data)

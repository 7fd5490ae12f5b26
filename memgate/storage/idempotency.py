"""Idempotency records: a write's first answer under the key its caller gave (SPEC §6,
"Idempotency keys"), in the file of the write itself.

A record is inserted in the transaction that stores the version, so a write and its record
commit together or not at all: a retry after a timeout finds either both (and gets the first
answer, writing nothing) or neither (and writes now). Records are scoped per member of a
workspace (one member's key never answers another's), hold the SHA-256 of the key (a caller's
key may be anything, personal data included), and are kept `KEPT` (24 h), then deleted. They
go through the connection's `execute`, so a cluster's standbys receive them with the version.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

import duckdb

SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    tenant      VARCHAR   NOT NULL,
    member_id   VARCHAR   NOT NULL,  -- whose key: the member who wrote (never across members)
    key_hash    VARCHAR   NOT NULL,  -- SHA-256 hex of the caller's key, never the key
    memory_id   VARCHAR   NOT NULL,  -- the first answer: the version stored, ...
    seq         BIGINT    NOT NULL,
    created_at  TIMESTAMP NOT NULL,  -- UTC
    superseded  INTEGER   NOT NULL,
    masked      VARCHAR   NOT NULL,  -- ... and what it said was masked (JSON counts)
    answered_at TIMESTAMP NOT NULL   -- UTC; the record goes `KEPT` later
);
"""

# A forget's first answer (how many versions it deleted), kept like a remember's.
DELETES_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotent_deletes (
    tenant      VARCHAR   NOT NULL,
    member_id   VARCHAR   NOT NULL,
    key_hash    VARCHAR   NOT NULL,
    deleted     INTEGER   NOT NULL,
    answered_at TIMESTAMP NOT NULL
);
"""

KEPT = timedelta(hours=24)
SWEEP_EVERY = timedelta(minutes=1)

INSERT = ("INSERT INTO idempotency", "(?, ?, ?, ?, ?, ?, ?, ?, ?)",  # for `inserts.insert`
          "SELECT unnest(?), unnest(?), unnest(?), unnest(?), unnest(?::BIGINT[]), "
          "unnest(?::TIMESTAMP[]), unnest(?::INTEGER[]), unnest(?), unnest(?::TIMESTAMP[])")


class Scoped(NamedTuple):
    """A key where it applies: (workspace, member, SHA-256 of the key)."""

    tenant: str
    member_id: str
    key_hash: str


class Answer(NamedTuple):
    """The first answer given under a key."""

    memory_id: str
    seq: int
    created_at: datetime  # naive UTC
    superseded: int
    masked: str  # JSON


class Records:
    """The idempotency table of one DuckDB file, read and written on its writer's thread."""

    def __init__(self, db: duckdb.DuckDBPyConnection) -> None:
        db.execute(SCHEMA)
        db.execute(DELETES_SCHEMA)
        self._swept = datetime.min

    def _sweep(self, db: duckdb.DuckDBPyConnection, now: datetime) -> None:
        """Records past `KEPT` deleted, at most once a `SWEEP_EVERY`."""
        if now - self._swept > SWEEP_EVERY:
            for table in ("idempotency", "idempotent_deletes"):
                db.execute(f"DELETE FROM {table} WHERE answered_at <= ?", [now - KEPT])
            self._swept = now

    def deleted(self, db: duckdb.DuckDBPyConnection, key: Scoped, now: datetime) -> int | None:
        """How many versions the forget first answered under this key deleted (None: no
        forget was answered under it)."""
        self._sweep(db, now)
        row = db.execute("SELECT deleted FROM idempotent_deletes WHERE tenant = ? AND "
                         "member_id = ? AND key_hash = ? AND answered_at > ?",
                         [*key, now - KEPT]).fetchone()
        return None if row is None else int(row[0])

    @staticmethod
    def record_deleted(db: duckdb.DuckDBPyConnection, key: Scoped, deleted: int,
                       now: datetime) -> None:
        """In the forget's transaction: its answer under `key`."""
        db.execute("INSERT INTO idempotent_deletes VALUES (?, ?, ?, ?, ?)",
                   [*key, deleted, now])

    def answered(self, db: duckdb.DuckDBPyConnection, keys: set[Scoped],
                 now: datetime) -> dict[Scoped, Answer]:
        """The first answers kept under these keys (`now`: naive UTC)."""
        since = now - KEPT
        self._sweep(db, now)
        if not keys:
            return {}
        hashes = sorted({k.key_hash for k in keys})
        found: dict[Scoped, Answer] = {}
        for tenant, member, key_hash, *answer in db.execute(
                "SELECT i.tenant, i.member_id, i.key_hash, i.memory_id, i.seq, i.created_at, "
                "i.superseded, i.masked FROM idempotency i "
                "JOIN (SELECT unnest(?::VARCHAR[]) AS h) k ON i.key_hash = k.h "
                "WHERE i.answered_at > ?", [hashes, since]).fetchall():
            scoped = Scoped(tenant, member, key_hash)
            if scoped in keys:
                found[scoped] = Answer(*answer)
        return found

"""The memory store's INSERTs of many rows as one statement: few rows bound row by row, more as
columns unnested. One `execute` each, so a cluster's recording ships it (`executemany` is not
recorded, `cluster.replication`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import duckdb

from memgate.storage.recent import Version

# INSERTs of a group's rows: (into, one row's placeholders, unnested columns' placeholders).
MEMORIES = (
    "INSERT INTO memories (memory_id, seq, tenant, subject_id, credential_id, namespace, key, "
    "collection_id, text, classification, derived_from, created_at, superseded_at, expires_at, "
    "legal_hold, citations, member_id, extras)",
    "(?, ?, ?, ?, ?, ?, ?, ?, ?, 'personal', ?, ?, ?, ?, false, ?, ?, ?)",
    "SELECT unnest(?), unnest(?), unnest(?), unnest(?), unnest(?), unnest(?), unnest(?), "
    "unnest(?), unnest(?), 'personal', unnest(?::VARCHAR[][]), unnest(?::TIMESTAMP[]), "
    "unnest(?::TIMESTAMP[]), unnest(?::TIMESTAMP[]), false, unnest(?), unnest(?), "
    "unnest(?::VARCHAR[])")
REMEMBER_LOG = ("INSERT INTO remember_log", "(?, ?)",
                "SELECT unnest(?), unnest(?::TIMESTAMP[])")
OUTBOX = ("INSERT INTO outbox", "(?, ?, ?)",
          "SELECT unnest(?::BIGINT[]), unnest(?), unnest(?::BLOB[])")
# Up to this many rows are bound row by row, more as lists unnested: DuckDB binds a few rows'
# placeholders faster (one remember's transaction: 3.7 -> 2.5 ms CPU), and lists of many.
ROWS_BOUND = 3

class Inserted(NamedTuple):
    """A row of `MEMORIES`, its values in the statement's column order."""

    memory_id: str
    seq: int
    tenant: str
    subject_id: str
    credential_id: str | None
    namespace: str | None
    key: str | None
    collection_id: str | None
    text: str
    derived_from: list[str]
    created_at: datetime
    superseded_at: datetime | None
    expires_at: datetime | None
    citations: str  # JSON
    member_id: str | None
    extras: str | None  # JSON

    def version(self) -> Version:
        return Version(self.memory_id, self.seq, self.tenant, self.subject_id,
                       self.namespace or "", self.key, self.collection_id, self.text,  # NOT NULL
                       self.created_at, self.superseded_at, self.citations, self.extras)


def insert(db: duckdb.DuckDBPyConnection, statement: tuple[str, str, str],
            rows: Sequence[tuple[Any, ...]]) -> None:
    into, row, unnested = statement
    if len(rows) <= ROWS_BOUND:
        db.execute(f"{into} VALUES {', '.join([row] * len(rows))}",
                   [value for r in rows for value in r])
    else:
        db.execute(f"{into} {unnested}", [list(column) for column in zip(*rows, strict=True)])

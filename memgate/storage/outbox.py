"""An outbox in a DuckDB file: events written in the same transaction as the change they announce.

Each event gets a sequence number from a persisted high-water mark, so a number is never handed
out twice in the file's life, even after the newest rows (and their events) are deleted: the
number is the event's `Nats-Msg-Id`, and JetStream drops an id it has seen as a duplicate.
"""

from __future__ import annotations

import duckdb

SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq     BIGINT  NOT NULL,
    subject VARCHAR NOT NULL,
    payload BLOB    NOT NULL
);
CREATE TABLE IF NOT EXISTS sequence (  -- one row: the highest number ever handed out
    last BIGINT NOT NULL
);
"""

Pending = list[tuple[int, str, bytes]]  # (seq, subject, payload), oldest first


def create(db: duckdb.DuckDBPyConnection, *, floor: int = 0) -> None:
    """Create the tables; a file from before the high-water mark starts it at `floor` (the
    highest number its rows still show)."""
    db.execute(SCHEMA)
    row = db.execute("SELECT count(*) FROM sequence").fetchone()
    if row is None or row[0] == 0:
        queued = db.execute("SELECT coalesce(max(seq), 0) FROM outbox").fetchone()
        db.execute("INSERT INTO sequence VALUES (?)", [max(floor, queued[0] if queued else 0)])


def next_seq(db: duckdb.DuckDBPyConnection) -> int:
    """The next number; call it inside the transaction that uses it, so a rollback returns it."""
    return next_seqs(db, 1)


def next_seqs(db: duckdb.DuckDBPyConnection, count: int) -> int:
    """The first of the next `count` numbers (consecutive), inside the caller's transaction."""
    row = db.execute("UPDATE sequence SET last = last + ? RETURNING last", [count]).fetchone()
    assert row is not None, "create() first"
    return int(row[0]) - count + 1


def queue(db: duckdb.DuckDBPyConnection, subject: str, payload: bytes) -> int:
    """Queue an event under a fresh number (inside the caller's transaction); the number."""
    seq = next_seq(db)
    db.execute("INSERT INTO outbox VALUES (?, ?, ?)", [seq, subject, payload])
    return seq


def pending(db: duckdb.DuckDBPyConnection, limit: int = 500) -> Pending:
    return [(int(r[0]), str(r[1]), bytes(r[2])) for r in db.execute(
        "SELECT seq, subject, payload FROM outbox ORDER BY seq LIMIT ?", [limit]).fetchall()]


def sent(db: duckdb.DuckDBPyConnection, up_to_seq: int) -> None:
    db.execute("DELETE FROM outbox WHERE seq <= ?", [up_to_seq])

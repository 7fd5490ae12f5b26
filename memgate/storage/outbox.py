"""An outbox in a DuckDB file: events written in the same transaction as the change they announce.

Each event gets a sequence number above a persisted high-water mark, so a number is never handed
out twice in the file's life, even after the newest rows (and their events) are deleted: the
number is in the event's `Nats-Msg-Id`, and JetStream drops an id it has seen as a duplicate. A
writer whose rows carry their numbers may persist the mark only when it deletes rows (`mark`):
at open, the mark is raised to the highest number its rows and the outbox still show (`create`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from itertools import islice

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

# Sent events are forgotten this many at a time: a kill -9 only makes the next start publish
# them again, which JetStream drops as duplicates (same ids) or consumers apply idempotently.
FORGET_EVERY = 256
# Unsent events mirrored in memory at most (JetStream down for long: read from the table).
MIRRORED = 10_000


def create(db: duckdb.DuckDBPyConnection, *, floor: int = 0) -> int:
    """Create the tables, the high-water mark raised to `floor` (the highest number the
    caller's rows show) and to the outbox's; the mark."""
    db.execute(SCHEMA)
    queued = db.execute("SELECT coalesce(max(seq), 0) FROM outbox").fetchone()
    high = max(floor, queued[0] if queued else 0)
    row = db.execute("SELECT max(last) FROM sequence").fetchone()
    last = None if row is None else row[0]
    if last is None:
        db.execute("INSERT INTO sequence VALUES (?)", [high])
    elif last < high:
        db.execute("UPDATE sequence SET last = ?", [high])
    return max(high, last or 0)


def mark(db: duckdb.DuckDBPyConnection, high: int) -> None:
    """Persist `high` as the highest number handed out (inside the caller's transaction), for
    a writer that numbers its rows itself and persists the mark only when rows carrying
    numbers are deleted (see `MemoryStore`)."""
    db.execute("UPDATE sequence SET last = greatest(last, ?)", [high])


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


class Unsent:
    """The unsent events of a file with a single writer, mirrored by it: the relay reads what
    was committed and not yet sent without a query, and what it sent is forgotten in batches.

    Until the file has been read once (at open), or after more than `MIRRORED` events piled
    up, the unsent events are read from the file (`read`: those above the highest seq sent).
    `forget` drops from the file what was sent up to a seq. The writer's thread commits, reads
    and forgets; `known` and `sent` may be called from any.
    """

    def __init__(self, read: Callable[[duckdb.DuckDBPyConnection, int, int], Pending],
                 forget: Callable[[duckdb.DuckDBPyConnection, int], None]) -> None:
        self._read, self._forget = read, forget
        self._lock = threading.Lock()
        self._events: deque[tuple[int, str, bytes]] = deque()
        self._mirrored = False  # whether `_events` is every unsent event
        self._sent = 0  # the highest seq published
        self._unforgotten = 0  # sent events the file still holds as unsent

    def committed(self, events: list[tuple[int, str, bytes]]) -> None:
        """Events of a transaction that has committed (in seq order)."""
        with self._lock:
            if not self._mirrored:
                return
            self._events.extend(events)
            if len(self._events) > MIRRORED:
                self._events.clear()
                self._mirrored = False

    def known(self, limit: int = 500) -> Pending | None:
        """The oldest unsent events, from memory; None when they are to be read from the
        file (`pending`)."""
        with self._lock:
            return list(islice(self._events, limit)) if self._mirrored else None

    def pending(self, db: duckdb.DuckDBPyConnection, limit: int = 500) -> Pending:
        """The oldest unsent events (on the writer's thread)."""
        if (known := self.known(limit)) is not None:
            return known
        with self._lock:
            after = self._sent
        rows = self._read(db, after, limit)
        if len(rows) < limit:  # every unsent one: mirror them from here on
            with self._lock:
                self._events = deque(r for r in rows if r[0] > self._sent)
                self._mirrored = True
        return rows

    def sent(self, up_to_seq: int) -> bool:
        """Events up to `up_to_seq` are published: the file forgets them with the next batch;
        True when a batch is due (`flush`)."""
        with self._lock:
            while self._events and self._events[0][0] <= up_to_seq:
                self._events.popleft()
            self._unforgotten += max(0, up_to_seq - self._sent)  # each seq is one event's
            self._sent = max(self._sent, up_to_seq)
            return self._unforgotten >= FORGET_EVERY

    def flush(self, db: duckdb.DuckDBPyConnection) -> None:
        """Forget every event sent (on the writer's thread; at a graceful stop too)."""
        with self._lock:
            up_to, unforgotten = self._sent, self._unforgotten
        if unforgotten:
            self._forget(db, up_to)
            with self._lock:
                self._unforgotten -= unforgotten

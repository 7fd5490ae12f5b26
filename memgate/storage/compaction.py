"""Rewriting a DuckDB file so that deleted rows leave every byte of it (SPEC §5.4).

DuckDB's DELETE marks rows deleted; a checkpoint frees their blocks but does not overwrite them,
and a row group it does not rewrite keeps its dictionary/FSST-compressed strings (measured with
duckdb 2.0.1: a deleted canary stayed in a small table's file through CHECKPOINT, FORCE
CHECKPOINT, VACUUM and close). So after deletions the file's owner copies the live rows into a
fresh file (`COPY FROM DATABASE`), swaps it in with an atomic rename, and reopens it: the old
file, with every freed block, is unlinked. A crash at any step leaves either the old file or
the new one at `path`, never a mix: a half-written copy (`<file>.compact`) is removed at open.

Only the file's single writer may call `rewrite`, on the thread that owns the connection.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import duckdb

from memgate.cluster import replication
from memgate.observe import metrics

SUFFIX = ".compact"
_TARGET = "memgate_compaction_target"
# One row: whether rows were deleted since the file was last rewritten. Set in the deleting
# transaction, cleared only in the fresh copy, so a crash between the two is caught at open.
_STATE = "CREATE TABLE IF NOT EXISTS compaction (pending BOOLEAN NOT NULL)"


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def _fresh(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def _remove(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _sync_directory(path: Path) -> None:
    """Make a rename in `path`'s directory durable."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def plain(path: Path) -> duckdb.DuckDBPyConnection:
    """The file's connection, as a standby's copy opens it (nothing recorded)."""
    # One thread: an owner's queries are small, and DuckDB's parallelism only cost CPU on them
    # (docs/DECISIONS.md, "CPU per command: fewer round trips").
    # Set, not passed as config: a connection the same process opens later joins this one.
    db = duckdb.connect(str(path))
    db.execute("SET threads TO 1")
    return db


_opened: dict[Path, duckdb.DuckDBPyConnection] = {}  # the owner's connection, by file


def _open(path: Path) -> duckdb.DuckDBPyConnection:
    """The owner's connection: its writes recorded for the standbys in a cluster
    (`cluster.replication`)."""
    db = plain(path)
    _opened[path.resolve()] = db
    return replication.opened(db, path)


def checkpoint(path: Path) -> None:
    """Everything committed to the file at `path` is in it (no WAL): what a copy reads."""
    db = _opened.get(path.resolve())
    if db is not None:
        db.execute("CHECKPOINT")


def connect(path: Path) -> duckdb.DuckDBPyConnection:
    """Open the file, first removing what a compaction that did not finish left beside it."""
    fresh = _fresh(path)
    _remove(fresh, _wal(fresh))
    return _open(path)


def open_owned(path: Path, schema: str) -> duckdb.DuckDBPyConnection:
    """Open (or make) a file whose single owner rewrites it after deletions: its `schema`
    made, a rewrite that a crash interrupted done now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = connect(path)
    db.execute(schema)
    create(db)
    return rewrite(db, path) if pending(db) else db


def create(db: duckdb.DuckDBPyConnection) -> None:
    db.execute(_STATE)
    row = db.execute("SELECT count(*) FROM compaction").fetchone()
    if row is None or row[0] == 0:
        db.execute("INSERT INTO compaction VALUES (false)")


def mark(db: duckdb.DuckDBPyConnection) -> None:
    """Rows were deleted: call it inside the deleting transaction."""
    db.execute("UPDATE compaction SET pending = true")


def pending(db: duckdb.DuckDBPyConnection) -> bool:
    """Whether deleted rows may still be in the file's bytes (`create` first)."""
    row = db.execute("SELECT bool_or(pending) FROM compaction").fetchone()
    return bool(row and row[0])


def rewrite(db: duckdb.DuckDBPyConnection, path: Path, *,
            standby: bool = False) -> duckdb.DuckDBPyConnection:
    """Replace the file at `path` (open as `db`) by a fresh one holding only its live rows;
    return a connection to it, `db` being closed. Should the copy fail, the half-written copy
    is removed and the error raised, `db` still open on the unchanged old file. `standby`: a
    copy of another node's store (`cluster.replication`)."""
    started = time.perf_counter()
    db = replication.raw(db)  # the copy's statements are not the standbys' to run
    fresh = _fresh(path)
    _remove(fresh, _wal(fresh))
    name = db.execute("SELECT current_database()").fetchone()
    assert name is not None
    quoted = str(fresh).replace("'", "''")
    try:
        db.execute("CHECKPOINT")
        db.execute(f"ATTACH '{quoted}' AS {_TARGET}")
        try:
            db.execute(f'COPY FROM DATABASE "{name[0]}" TO {_TARGET}')
            db.execute(f"UPDATE {_TARGET}.compaction SET pending = false")
        finally:
            db.execute(f"DETACH {_TARGET}")  # checkpoints the copy: no WAL left beside it
    except BaseException:
        _remove(fresh, _wal(fresh))
        raise
    db.close()  # checkpoints: every committed row is in the old file, which is now unused
    _remove(_wal(path))  # the old file's (empty after the close) must never replay onto the new
    os.replace(fresh, path)
    _sync_directory(path)
    reopened = plain(path) if standby else _open(path)
    replication.rewritten(path)  # each standby rewrites its copy at this point too
    # `memgate_file_rewrite_seconds{file="memories"}`: a kind of file, never a tenant's
    metrics.REWRITE_SECONDS.labels(path.stem).observe(time.perf_counter() - started)
    return reopened


class Rewritable:
    """A store of one DuckDB file (`_db` on `_path`) that deletions leave for a rewrite."""

    _db: duckdb.DuckDBPyConnection
    _path: Path
    deletions_pending: bool = False

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The file's connection now (a rewrite replaces it): what a backup reads."""
        return self._db

    def compact(self) -> None:
        """Rewrite the file with only its live rows, so what was deleted leaves every byte of
        it (SPEC §5.4)."""
        self.deletions_pending = False  # a deletion from here on needs the next rewrite
        try:
            self._db = rewrite(self._db, self._path)
        except BaseException:
            self.deletions_pending = True
            raise

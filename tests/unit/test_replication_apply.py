"""A standby's copy holds what its owner's file holds when the statements it applies were made
fewer (`replication.merged`): a real memory store's writes, recorded as an owner records them,
applied to a copy of its file at once (as a standby applies what a tenth of a second brought)."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from memgate.cluster import replication
from memgate.storage import Filters, MemoryStore, Remember
from memgate.storage import compaction
from memgate.policy.idempotency import digest
from memgate.storage.vectors import VectorStore

pytestmark = pytest.mark.unit

TABLES = ("memories", "outbox", "relayed", "remember_log")


def remember(text: str, key: str | None = None) -> Remember:
    return Remember(Filters("ws", "member", "notes", key, None), memory_id=str(uuid.uuid4()),
                    credential_id="cred", text=text, retention_days=30)


def rows(db: duckdb.DuckDBPyConnection, table: str) -> list[tuple[Any, ...]]:
    return db.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall()


def applied(copy: Path, statements: list[tuple[str, list[Any]]]) -> duckdb.DuckDBPyConnection:
    """The copy, `statements` applied in one transaction as a standby runs them."""
    standby = compaction.plain(copy)
    standby.begin()
    replication._execute(standby, statements)
    standby.commit()
    return standby


def statements_of(units: list[replication.Unit]) -> list[tuple[str, list[Any]]]:
    found = []
    for _, statements in units:
        assert isinstance(statements, list)
        found += statements
    return found


def test_a_copy_given_the_merged_statements_holds_what_the_owner_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replication, "_root", tmp_path.resolve())  # this process records
    owner, copy = tmp_path / "memories.duckdb", tmp_path / "copy" / "memories.duckdb"
    store = MemoryStore(owner)
    store.connection.execute("CHECKPOINT")
    copy.parent.mkdir()
    shutil.copy(owner, copy)  # the full copy a standby starts from

    units: list[replication.Unit] = []
    groups = [[remember("one")], [remember("two", key="k")], [remember("three", key="k")],
              [remember(f"many {n}") for n in range(5)],  # columns unnested, not rows
              [remember("four")], [remember("five", key="k"), remember("six")]]
    for group in groups:
        outcomes, exc, committed = replication.journaled(store.remember_group, group)
        assert exc is None and not any(isinstance(o, Exception) for o in outcomes or [])
        units += committed
    _, exc, committed = replication.journaled(
        lambda: store.delete("ws", "member", memory_id=groups[0][0].memory_id,
                             event_subject="memories", event=lambda owner, ids: b"{}"))
    assert exc is None
    units += committed
    _, exc, committed = replication.journaled(store.events_sent, 10_000)
    units += committed
    for group in ([remember("seven")], [remember("eight")]):
        _, exc, committed = replication.journaled(store.remember_group, group)
        units += committed

    statements = statements_of(units)
    fewer = replication.merged(statements)
    assert len(fewer) < len(statements)
    standby = applied(copy, fewer)
    for table in TABLES:
        assert rows(standby, table) == rows(store.connection, table), table
    store.close()
    standby.close()


def test_vectors_put_one_after_another_are_put_as_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedder's vectors (columns unnested, blobs among them) made one statement."""
    monkeypatch.setattr(replication, "_root", tmp_path.resolve())
    owner, copy = tmp_path / "vectors.duckdb", tmp_path / "copy" / "vectors.duckdb"
    vectors = VectorStore(owner)
    vectors.connection.execute("CHECKPOINT")
    copy.parent.mkdir()
    shutil.copy(owner, copy)
    units: list[replication.Unit] = []
    for n in range(4):
        ids = [str(uuid.uuid4()) for _ in range(n + 1)]
        matrix = np.full((n + 1, 384), n, dtype=np.float32)
        _, exc, committed = replication.journaled(
            vectors.put, ids, [("ws", "member")] * (n + 1), matrix)
        assert exc is None
        units += committed
    statements = statements_of(units)
    fewer = replication.merged(statements)
    assert len(fewer) == 1 < len(statements)
    standby = applied(copy, fewer)
    assert rows(standby, "vectors") == rows(vectors.connection, "vectors")
    assert len(rows(standby, "vectors")) == 10


def test_an_imports_rows_and_its_idempotency_records_reach_the_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bulk import (1,000 rows, one job) and keyed remembers are recorded as an owner ships
    them: a copy given the statements holds its memories and idempotency records."""
    monkeypatch.setattr(replication, "_root", tmp_path.resolve())
    owner, copy = tmp_path / "memories.duckdb", tmp_path / "copy" / "memories.duckdb"
    store = MemoryStore(owner)
    store.connection.execute("CHECKPOINT")
    copy.parent.mkdir()
    shutil.copy(owner, copy)

    def keyed(text: str, key: str) -> Remember:
        return replace(remember(text), rate="imports", idempotency=digest(key))

    units: list[replication.Unit] = []
    for group in ([keyed(f"imported {n}", f"i{n}") for n in range(1000)],
                  [keyed("one keyed", "solo")], [keyed("again", "solo"), remember("plain")]):
        outcomes, exc, committed = replication.journaled(store.remember_group, group)
        assert exc is None and not any(isinstance(o, Exception) for o in outcomes or [])
        units += committed
    standby = applied(copy, replication.merged(statements_of(units)))
    for table in ("memories", "idempotency"):
        assert rows(standby, table) == rows(store.connection, table), table
    assert len(rows(standby, "idempotency")) == 1001
    store.close()
    standby.close()


def test_a_registrys_passages_and_a_with_delete_reach_the_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write is recorded, whatever its call or its first keyword: the registry's
    passages go in by `executemany`, and a `WITH … DELETE` deletes. Before, neither was
    shipped: a promoted registry had documents without passages (issue 47)."""
    from memgate.storage.registry import RegistryStore

    monkeypatch.setattr(replication, "_root", tmp_path.resolve())
    owner, copy = tmp_path / "registry.duckdb", tmp_path / "copy" / "registry.duckdb"
    store = RegistryStore(owner)
    store.connection.execute("CHECKPOINT")
    copy.parent.mkdir()
    shutil.copy(owner, copy)

    units: list[replication.Unit] = []
    collection, exc, committed = replication.journaled(store.create_collection, "ws", "docs")
    units += committed
    for document in ("d1", "d2"):
        _, exc, committed = replication.journaled(
            lambda d=document: store.put_document(
                "ws", d, collection_id=str(collection), expires_at=None, restricted=False,
                passages=[(f"{d}-p{n}", f"sha{n}", {}) for n in range(3)],
                event_subject="documents", event=b"{}"))
        assert exc is None
        units += committed
    _, exc, committed = replication.journaled(lambda: store.connection.execute(
        "WITH gone AS (SELECT 'd2' AS id) DELETE FROM passages WHERE document_id IN "
        "(SELECT id FROM gone) AND passage_id = 'd2-p0'"))
    assert exc is None
    units += committed

    standby = applied(copy, replication.merged(statements_of(units)))
    assert len(rows(standby, "passages")) == 5
    for table in ("collections", "documents", "passages", "outbox"):
        assert rows(standby, table) == rows(store.connection, table), table
    store.close()
    standby.close()


async def test_a_standby_answers_a_batch_once_its_files_hold_it(tmp_path: Path) -> None:
    """What the owner acknowledges is on the standby's disk when it answers, so a standby
    killed outright keeps it. Before, it answered holding the batch in memory and applied it
    0.1 s later (issue 47)."""
    file = "registry.duckdb"
    db = duckdb.connect(str(tmp_path / file))
    db.execute("CREATE TABLE t (n INTEGER)")
    db.close()

    async def nothing() -> None:
        return None

    standby = replication.Standby("registry", node="b", bus=None,  # type: ignore[arg-type]
                                  js=lambda: None,  # type: ignore[arg-type,return-value]
                                  data_dir=tmp_path, become=nothing, disk_home={})
    await standby._thread(standby._open)
    standby._epoch, standby._seq = 7, 0
    batches = [replication.encode_batch(7, seq, [(file, [("INSERT INTO t VALUES (?)", [seq])])])
               for seq in (1, 2, 3)]
    for seq, batch in enumerate(batches, 1):
        assert (await standby.apply(batch)).seq == seq
        held = await standby._thread(
            lambda: standby._db[file].execute("SELECT count(*) FROM t").fetchone())
        assert held == (seq,)
    # batches that come while one is applied are answered once all are in the files
    more = [replication.encode_batch(7, seq, [(file, [("INSERT INTO t VALUES (?)", [seq])])])
            for seq in (4, 5, 6)]
    await asyncio.gather(*(standby.apply(batch) for batch in more))
    assert await standby._thread(
        lambda: standby._db[file].execute("SELECT count(*) FROM t").fetchone()) == (6,)
    await standby._thread(standby._close)
    standby._thread.shutdown()


async def test_an_owner_with_no_standby_in_sync_refuses_a_write_before_it_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 503 means "not written": an owner whose standbys are all out of sync (dead, or still
    copying the store) refuses a job at its first write, DuckDB or plain file, and nothing is
    in its files; what only reads still answers. Before, it wrote, answered 200, and the write
    was on one disk (issue 47: 19 remembers acknowledged while the only standby was dead)."""
    from memgate.contracts.errors import UnavailableError
    from memgate.storage.audit import AuditEntry, AuditLog

    monkeypatch.setattr(replication, "_root", tmp_path.resolve())  # noqa: ASYNC240 (setup)
    store = MemoryStore(tmp_path / "memories.duckdb")
    audit = AuditLog(tmp_path / "audit")
    alone = replication.Primary("storage.p0", lease=None, bus=None, kv=None,  # type: ignore[arg-type]
                                homes=None, data_dir=tmp_path, standbys=1)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()

    async def job(fn: Any, *args: Any) -> Any:
        return await alone.committed(
            await loop.run_in_executor(None, alone.journal, loop, fn, *args))

    [outcome] = await job(store.remember_group, [remember("on one disk only")])
    assert isinstance(outcome, UnavailableError)
    with pytest.raises(UnavailableError):
        await job(audit.append, AuditEntry(action="memories_deleted", actor="storage.p0"))
    assert rows(store.connection, "memories") == []
    assert not (tmp_path / "audit" / "audit.log").exists() or \
        (tmp_path / "audit" / "audit.log").read_bytes() == b""
    assert await job(lambda: rows(store.connection, "memories")) == []  # reads answer
    store.close()

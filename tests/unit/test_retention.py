"""The memory store's side of retention and of "deleted means gone", on real DuckDB files:
reap cutoffs and expires_at, legal holds, the derived_from cascade, compaction (the bytes leave
the file, the live rows stay, a crash before the rewrite is caught at open), and compactions
shared by the deletions that wait together."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest

from memgate.runtime.actor import Serial
from memgate.runtime.compaction import Compactions
from memgate.storage import Filters, MemoryStore
from memgate.storage.compaction import SUFFIX

pytestmark = pytest.mark.unit

SUBJECT = "events"


def event(*parts: object) -> bytes:
    return b"{}"


def remember(store: MemoryStore, tenant: str, text: str, *, days: int = 90,
             member: str = "member") -> str:
    memory_id = str(uuid.uuid4())
    store.remember(Filters(tenant, member, "notes"), memory_id=memory_id, credential_id=memory_id,
                   text=text, retention_days=days)
    return memory_id


def ids(store: MemoryStore, tenant: str, member: str = "member") -> set[str]:
    return {r.memory_id for r in store.versions(Filters(tenant, member), as_of=datetime.now(UTC)
                                                + timedelta(days=1000), limit=1000)}


def on_disk(path: Path, word: str) -> bool:
    return any(word.encode() in p.read_bytes() for p in path.parent.glob(path.name + "*"))


def with_file(path: Path, sql: str, params: list[object]) -> None:
    db = duckdb.connect(str(path))
    db.execute(sql, params)
    db.close()


def reap(store: MemoryStore, now: datetime, **days: int) -> list[str]:
    return store.reap(now, {t: now - timedelta(days=d) for t, d in days.items()},
                      event_subject=SUBJECT, event=event)


def test_reap_uses_each_workspaces_retention_and_every_expires_at(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.duckdb")
    short = remember(store, "a", "in a short-lived workspace")
    long = remember(store, "b", "in a long-lived workspace")
    ttl = remember(store, "c", "its own short ttl", days=5)  # c unnamed: expires_at only
    now = datetime.now(UTC)
    assert reap(store, now + timedelta(days=4), a=10, b=100) == []
    assert reap(store, now + timedelta(days=6), a=10, b=100) == [ttl]
    assert reap(store, now + timedelta(days=11), a=10, b=100) == [short]
    assert reap(store, now + timedelta(days=11), a=10, b=100) == []  # idempotent
    assert ids(store, "b") == {long}
    store.close()


def test_legal_holds_are_never_reaped_or_deleted(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    store = MemoryStore(path)
    held = remember(store, "a", "kept for the court")
    free = remember(store, "a", "not held")
    store.close()
    with_file(path, "UPDATE memories SET legal_hold = true WHERE memory_id = ?", [held])
    store = MemoryStore(path)
    assert ids(store, "a") == {free}  # the held one hidden
    assert len(reap(store, datetime.now(UTC) + timedelta(days=999), a=1)) == 1
    assert store.delete("a", event_subject=SUBJECT, event=event) == []
    store.close()
    db = duckdb.connect(str(path), read_only=True)
    assert db.execute("SELECT memory_id FROM memories").fetchall() == [(held,)]
    db.close()


def test_deleting_a_source_deletes_what_derives_from_it_to_the_end_of_the_chain(
        tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    store = MemoryStore(path)
    source = remember(store, "a", "the source")
    summary = remember(store, "a", "a summary of it")
    digest = remember(store, "a", "a digest of the summary")
    held = remember(store, "a", "derived, but on hold")
    other_tenant = remember(store, "b", "same source id, another tenant")
    unrelated = remember(store, "a", "unrelated")
    store.close()
    for derived, origin in ((summary, source), (digest, summary), (held, source),
                            (other_tenant, source)):
        with_file(path, "UPDATE memories SET derived_from = [?] WHERE memory_id = ?",
                  [origin, derived])
    with_file(path, "UPDATE memories SET legal_hold = true WHERE memory_id = ?", [held])
    store = MemoryStore(path)
    deleted = store.delete("a", "member", memory_id=source, event_subject=SUBJECT, event=event)
    assert sorted(deleted) == sorted([source, summary, digest])
    assert ids(store, "a") == {unrelated}
    assert ids(store, "b") == {other_tenant}  # tenant is mandatory, even for a cascade
    store.close()


def test_compaction_removes_deleted_text_from_the_file_and_keeps_the_rest(
        tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    store = MemoryStore(path)
    for i in range(300):
        remember(store, "a", f"filler memory number {i}")
    store.close()  # checkpointed: the canary below sits in the file, not only the WAL
    store = MemoryStore(path)
    gone = remember(store, "a", "the canary zqxcanaryalpha")
    kept = remember(store, "a", "the survivor zqxcanarybravo")
    store.close()
    store = MemoryStore(path)
    assert on_disk(path, "zqxcanaryalpha")
    store.delete("a", memory_id=gone, event_subject=SUBJECT, event=event)
    assert store.deletions_pending
    store.compact()
    assert not store.deletions_pending
    assert not on_disk(path, "zqxcanaryalpha")
    assert on_disk(path, "zqxcanarybravo")
    assert kept in ids(store, "a") and len(ids(store, "a")) == 301
    later = remember(store, "a", "written after the rewrite")  # seq keeps climbing
    assert later in ids(store, "a")
    store.close()
    assert not on_disk(path, "zqxcanaryalpha")


def test_a_deletion_not_yet_compacted_is_compacted_at_the_next_open(tmp_path: Path) -> None:
    path = tmp_path / "m.duckdb"
    store = MemoryStore(path)
    gone = remember(store, "a", "the canary zqxcanarycharlie")
    store.close()
    store = MemoryStore(path)
    store.delete("a", memory_id=gone, event_subject=SUBJECT, event=event)
    store.close()  # as if the process died before its compaction ran
    (tmp_path / f"m.duckdb{SUFFIX}").write_bytes(b"half a copy")  # and one was half-written
    store = MemoryStore(path)
    assert not store.deletions_pending
    assert not on_disk(path, "zqxcanarycharlie")
    assert not (tmp_path / f"m.duckdb{SUFFIX}").exists()
    store.close()


async def test_deletions_waiting_together_share_one_compaction() -> None:
    serial = Serial("test")
    started, release = threading.Event(), threading.Event()

    def deleting() -> None:  # a deletion in progress on the serial thread
        started.set()
        release.wait(5)

    store = SimpleNamespace(compact=lambda: None, deletions_pending=True)
    compactions = Compactions(serial, lambda: store, "test")
    busy = asyncio.ensure_future(serial(deleting))
    await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
    waiting = [asyncio.ensure_future(compactions.after_deletion()) for _ in range(10)]
    await asyncio.sleep(0)  # each has asked (one turn of the loop), none has been served
    release.set()
    await asyncio.gather(busy, *waiting)
    assert compactions.runs == 1  # not 10
    await compactions.after_deletion()  # a deletion after that run: a run of its own
    assert compactions.runs == 2
    serial.shutdown()

"""The memory store's `known_*` answers, given from memory on the event loop while the writer's
thread commits: each equals the writer's own answer whenever it is given, is given for what
was just written, and reading them while commits run never fails or sees half a commit."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memgate.storage import Filters, MemoryStore
from tests.unit.test_store_caches import MEMBERS, SUBJECT, TENANT, deleted_event, remember

pytestmark = pytest.mark.unit


def same_as_the_writers(store: MemoryStore, ids: list[str]) -> int:
    """Every known answer equals the writer's; how many were known."""
    given = 0
    now = datetime.now(UTC)
    for member in MEMBERS:
        high = store.high_seq(TENANT, member)
        for after in range(high + 1):
            for texts in (False, True):
                if (known := store.known_catalog(TENANT, member, after,
                                                 texts=texts)) is not None:
                    given += 1
                    assert known == (high, store.catalog(TENANT, member, after, texts=texts))
        for wanted in ([*ids], ids[-1:], []):
            if (texts := store.known_texts(TENANT, member, wanted)) is not None:
                given += 1
                assert texts == store.texts(TENANT, member, wanted)
        if (scope := store.known_scope(TENANT, member)) is not None:
            given += 1
            assert (scope, None, []) == store.recall_scope(Filters(TENANT, member), as_of=now,
                                                           window=None)
        for filters in (Filters(TENANT, member), Filters(TENANT, member, namespace="facts"),
                        Filters(TENANT, member, collection_ids=("c1",))):
            for as_of in (now, now - timedelta(days=1)):
                if (rows := store.known_rows(filters, as_of=as_of, memory_ids=ids)) is not None:
                    given += 1
                    assert sorted(rows, key=lambda r: r.seq) == sorted(
                        store.rows(filters, as_of=as_of, memory_ids=ids), key=lambda r: r.seq)
    return given


def test_known_answers_equal_the_writers_after_each_kind_of_write(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memories.duckdb")
    ids = [remember(store, "plain").memory_id,
           remember(store, "keyed v1", key="k").memory_id,
           remember(store, "a fact", namespace="facts", collection="c1").memory_id,
           remember(store, "the other member's", member="m2").memory_id]
    assert store.known_texts(TENANT, "m1", ids[:3]) is not None  # just written: held
    assert store.known_catalog(TENANT, "m1", 0) is not None
    assert same_as_the_writers(store, ids) > 0
    ids.append(remember(store, "keyed v2", key="k").memory_id)  # supersedes v1
    assert same_as_the_writers(store, ids) > 0
    store.delete(TENANT, "m1", memory_id=ids[-1], event_subject=SUBJECT, event=deleted_event)
    assert store.known_catalog(TENANT, "m1", 0) is None  # its newest seq is read again
    assert same_as_the_writers(store, ids) > 0
    ids.append(remember(store, "cites d1", cites="d1").memory_id)
    assert store.known_scope(TENANT, "m1") is None  # a citing version: scope reads the file
    same_as_the_writers(store, ids)
    store.close()
    reopened = MemoryStore(tmp_path / "memories.duckdb")  # nothing held yet
    assert reopened.known_texts(TENANT, "m1", ids[:1]) is None
    assert reopened.known_catalog(TENANT, "m1", 0) is None
    same_as_the_writers(reopened, ids)
    reopened.close()


def test_the_relay_reads_and_marks_sent_events_from_memory(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memories.duckdb")
    assert store.known_pending_events() is None  # the table is read once, by the writer
    assert store.pending_events() == []
    first, second = remember(store, "one"), remember(store, "two")
    assert [seq for seq, _, _ in store.known_pending_events() or []] == [first.seq, second.seq]
    assert store.known_events_sent(first.seq) is False  # no batch of rows to delete yet
    assert [seq for seq, _, _ in store.known_pending_events() or []] == [second.seq]
    store.close()  # deletes the rows of the events sent
    reopened = MemoryStore(tmp_path / "memories.duckdb")
    assert [seq for seq, _, _ in reopened.pending_events()] == [second.seq]
    reopened.close()


def test_known_answers_read_while_the_writer_commits_never_fail(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memories.duckdb")
    ids = [remember(store, "first").memory_id]
    done = threading.Event()
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(100):  # under the hourly limit
                ids.append(remember(store, f"note {i}", key=f"k{i % 7}").memory_id)
                if i % 25 == 24:
                    store.delete(TENANT, "m1", memory_id=ids[-3], event_subject=SUBJECT,
                                 event=deleted_event)
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    while not done.is_set():
        snapshot = list(ids)
        known = store.known_catalog(TENANT, "m1", 0)
        if known is not None:  # one instant: the newest seq is the catalog's last one
            high, rows = known
            assert not rows or rows[-1][1] == high
        store.known_texts(TENANT, "m1", snapshot)
        store.known_rows(Filters(TENANT, "m1"), as_of=datetime.now(UTC), memory_ids=snapshot)
        store.known_pending_events()
        reads += 1
        # let the writer's thread have the GIL: a reader that never waits makes each of its
        # returns from DuckDB wait out the switch interval (100 remembers: 29 s, not 1.4 s)
        time.sleep(0)
    thread.join()
    assert not failures and reads > 0
    same_as_the_writers(store, ids)
    store.close()

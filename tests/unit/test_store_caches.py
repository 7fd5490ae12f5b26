"""The memory store answers from what it wrote (its latest versions, owners' newest seq, whether
they cite anything, the unsent events) exactly as DuckDB would: after remembers, supersedes,
forgets of the newest version, purges, cascades, reaps and a compaction, every answer equals the
one the same file gives when opened afresh (nothing in memory). The outbox mirror resends, after
a crash, every event committed and not acknowledged as sent."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memgate.storage import Filters, MemoryStore, Remember, Stored
from memgate.storage.recent import Recent, Version

pytestmark = pytest.mark.unit

SUBJECT = "events"
TENANT = "w1"
MEMBERS = ("m1", "m2")


def remember(store: MemoryStore, text: str, *, member: str = "m1", key: str | None = None,
             namespace: str = "notes", collection: str | None = None,
             cites: str | None = None) -> Stored:
    citations = () if cites is None else ({"passageId": f"p-{cites}", "documentId": cites},)
    [outcome] = store.remember_group([Remember(
        Filters(TENANT, member, namespace, key, collection), memory_id=str(uuid.uuid4()),
        credential_id=f"c-{member}", text=text, retention_days=30, citations=citations)])
    assert isinstance(outcome, Stored), outcome
    return outcome


def deleted_event(*parts: object) -> bytes:
    return json.dumps({"deleted": str(parts[-1])}).encode()


def answers(store: MemoryStore, ids: list[str]) -> dict[str, Any]:
    """What the indexer, the embedder and recall ask, for both owners and every id ever seen."""
    now = datetime.now(UTC)
    found: dict[str, Any] = {}
    for member in MEMBERS:
        high = store.high_seq(TENANT, member)
        found[f"{member} high"] = high
        for after in range(high + 1):
            found[f"{member} catalog {after}"] = store.catalog(TENANT, member, after)
            found[f"{member} catalog {after} texts"] = store.catalog(TENANT, member, after,
                                                                     texts=True)
        found[f"{member} texts"] = store.texts(TENANT, member, ids)
        found[f"{member} all texts"] = store.texts(TENANT, member, None)
        for each in ids:
            found[f"{member} text {each}"] = store.texts(TENANT, member, [each])
        for name, filters in {
            "all": Filters(TENANT, member),
            "notes": Filters(TENANT, member, namespace="notes"),
            "facts": Filters(TENANT, member, namespaces=("facts", "other")),
            "c1": Filters(TENANT, member, collection_id="c1"),
            "set": Filters(TENANT, member, collection_ids=("c1", "c2")),
        }.items():
            for at, as_of in (("now", now), ("past", now - timedelta(days=1))):
                found[f"{member} scope {name} {at}"] = store.recall_scope(
                    filters, as_of=as_of, window=None)
                found[f"{member} window {name} {at}"] = store.recall_scope(
                    filters, as_of=as_of, window=2)
                found[f"{member} rows {name} {at}"] = sorted(
                    store.rows(filters, as_of=as_of, memory_ids=ids), key=lambda r: r.seq)
    return found


def test_every_answer_from_memory_equals_the_files_after_each_kind_of_write(
        tmp_path: Path) -> None:
    path = tmp_path / "memories.duckdb"
    store = MemoryStore(path)
    ids: list[str] = []

    def check() -> None:
        nonlocal store
        warm = answers(store, ids)
        store.close()
        reference = MemoryStore(path)
        reference._mirror = Recent(floor=2**62, recent=0, read=0)  # holds nothing: the file
        assert answers(reference, ids) == warm
        reference.close()
        store = MemoryStore(path)

    def new(stored: Stored) -> str:
        ids.append(stored.memory_id)
        return stored.memory_id

    new(remember(store, "plain"))
    new(remember(store, "keyed v1", key="k"))
    new(remember(store, "cites a document", cites="d1", collection="c1"))
    new(remember(store, "a fact", namespace="facts", collection="c2"))
    new(remember(store, "outside the context set", collection="c3"))
    new(remember(store, "the other member's", member="m2", cites="d2"))
    check()  # answered from what was read after the reopen, and from the file
    new(remember(store, "keyed v2", key="k"))  # supersedes v1 (read before, not committed now)
    check()
    newest = new(remember(store, "the newest, forgotten next", key="k"))
    assert store.high_seq(TENANT, "m1") == store.catalog(TENANT, "m1", 0)[-1][1]
    store.delete(TENANT, "m1", memory_id=newest, event_subject=SUBJECT, event=deleted_event)
    check()
    new(remember(store, "cites d1 as well", cites="d1"))
    store.delete(TENANT, cited_documents=["d1"], event_subject=SUBJECT, event=deleted_event)
    check()
    new(remember(store, "in the context set", collection="c2"))
    store.delete(TENANT, "m1", memory_ids=[ids[0]], event_subject=SUBJECT, event=deleted_event)
    store.compact()
    check()
    new(remember(store, "the second member's newest", member="m2"))
    store.reap(datetime.now(UTC) + timedelta(days=31), {}, event_subject=SUBJECT,
               event=deleted_event)  # every expires_at passed: nothing left
    check()
    assert store.high_seq(TENANT, "m1") == 0
    store.close()


def test_the_owners_newest_seq_drops_when_its_newest_version_is_forgotten(
        tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memories.duckdb")
    older = remember(store, "older")
    newest = remember(store, "newest")
    now = datetime.now(UTC)
    assert store.recall_scope(Filters(TENANT, "m1"), as_of=now, window=None) == (
        newest.seq, None, [])
    store.delete(TENANT, "m1", memory_id=newest.memory_id, event_subject=SUBJECT,
                 event=deleted_event)
    assert store.recall_scope(Filters(TENANT, "m1"), as_of=now, window=None) == (
        older.seq, None, [])
    assert [row[0] for row in store.catalog(TENANT, "m1", 0)] == [older.memory_id]
    assert store.texts(TENANT, "m1", [newest.memory_id]) == []
    store.close()


def test_a_citing_version_makes_scope_read_its_citations_and_its_deletion_stops_it(
        tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memories.duckdb")
    plain = remember(store, "plain")
    now = datetime.now(UTC)
    assert store.recall_scope(Filters(TENANT, "m1"), as_of=now, window=None) == (
        plain.seq, None, [])  # known to cite nothing
    citing = remember(store, "cites", cites="d1")
    now = datetime.now(UTC)
    high, total, cited = store.recall_scope(Filters(TENANT, "m1"), as_of=now, window=None)
    assert (high, total, [memory_id for memory_id, _ in cited]) == (
        citing.seq, 2, [citing.memory_id])
    store.delete(TENANT, "m1", memory_id=citing.memory_id, event_subject=SUBJECT,
                 event=deleted_event)
    assert store.recall_scope(Filters(TENANT, "m1"), as_of=now, window=None) == (
        plain.seq, None, [])
    store.close()


def test_texts_and_rows_after_a_supersede_show_the_new_version_current(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memories.duckdb")
    first = remember(store, "lives in Paris", key="home")
    second = remember(store, "lives in Lyon", key="home")
    ids = [first.memory_id, second.memory_id]
    assert store.texts(TENANT, "m1", ids) == [(first.memory_id, "lives in Paris"),
                                              (second.memory_id, "lives in Lyon")]
    now = datetime.now(UTC)
    rows = store.rows(Filters(TENANT, "m1"), as_of=now, memory_ids=ids)
    assert [r.text for r in rows] == ["lives in Lyon"]
    before = store.rows(Filters(TENANT, "m1"), as_of=second.created_at - timedelta(
        microseconds=1), memory_ids=ids)
    assert [r.text for r in before] == ["lives in Paris"]
    [catalogued, _] = store.catalog(TENANT, "m1", 0)
    assert catalogued[6] == second.created_at  # superseded_at
    assert store.rows(Filters(TENANT, "m2"), as_of=now, memory_ids=ids) == []  # another owner's
    assert store.texts(TENANT, "m2", ids) == []
    store.close()


def test_a_version_is_found_right_after_its_remember(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memories.duckdb")
    for i in range(5):
        stored = remember(store, f"note {i}")
        assert store.high_seq(TENANT, "m1") == stored.seq
        assert store.catalog(TENANT, "m1", stored.seq - 1)[0][:2] == (stored.memory_id,
                                                                     stored.seq)
        assert store.texts(TENANT, "m1", [stored.memory_id]) == [(stored.memory_id,
                                                                  f"note {i}")]
        [row] = store.rows(Filters(TENANT, "m1"), as_of=datetime.now(UTC),
                           memory_ids=[stored.memory_id])
        assert (row.memory_id, row.text, row.created_at) == (stored.memory_id, f"note {i}",
                                                              stored.created_at)
    store.close()


def test_versions_beyond_what_memory_holds_are_read_from_the_file() -> None:
    recent = Recent(floor=0, recent=2, read=1)

    def version(seq: int) -> Version:
        return Version(f"id{seq}", seq, TENANT, "m1", "notes", None, None, "t",
                       datetime(2026, 1, 1), None, "[]")

    recent.committed([version(1), version(2), version(3)], [])
    assert recent.floor == 1  # the first one left: versions above 1 are all held
    assert recent.above((TENANT, "m1"), 0) is None  # not all held: read the file
    assert [v.seq for v in recent.above((TENANT, "m1"), 1) or []] == [2, 3]
    assert recent.get("id1") is not None  # kept among those read lately
    recent.committed([version(4)], [])
    assert recent.get("id1") is None and recent.get("id2") is not None


def test_events_committed_and_not_acknowledged_are_resent_after_a_crash(
        tmp_path: Path) -> None:
    path = tmp_path / "memories.duckdb"
    store = MemoryStore(path)
    seqs = [remember(store, f"note {i}").seq for i in range(5)]
    assert [seq for seq, _, _ in store.pending_events(limit=2)] == seqs[:2]
    store.events_sent(seqs[1])
    assert [seq for seq, _, _ in store.pending_events()] == seqs[2:]
    store._db.close()  # a crash: no graceful stop, nothing flushed
    store = MemoryStore(path)
    resent = [seq for seq, _, _ in store.pending_events()]
    assert set(seqs[2:]) <= set(resent) <= set(seqs)  # the sent ones at most once more
    store.events_sent(resent[-1])
    assert store.pending_events() == []
    later = remember(store, "after the restart").seq
    assert [seq for seq, _, _ in store.pending_events()] == [later]
    store.close()
    store = MemoryStore(path)
    assert [seq for seq, _, _ in store.pending_events()] == [later]  # not sent: still there
    store.events_sent(later)
    store.close()  # a graceful stop deletes the sent rows
    store = MemoryStore(path)
    assert store.pending_events() == []
    store.close()


def test_a_deletions_event_is_relayed_after_the_remembers_before_it(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "memories.duckdb")
    stored = remember(store, "soon forgotten")
    store.events_sent(store.pending_events()[-1][0])
    store.delete(TENANT, "m1", memory_id=stored.memory_id, event_subject=SUBJECT,
                 event=deleted_event)
    later = remember(store, "after the forget")
    pending = store.pending_events()
    assert [seq for seq, _, _ in pending] == [later.seq - 1, later.seq]
    assert json.loads(pending[0][2]) == {"deleted": str([stored.memory_id])}
    store.close()


def test_the_relay_reads_a_long_outbox_in_pages_and_then_from_memory(tmp_path: Path) -> None:
    path = tmp_path / "memories.duckdb"
    store = MemoryStore(path)
    seqs = [remember(store, f"note {i}").seq for i in range(7)]
    store._db.close()
    store = MemoryStore(path)
    relayed: list[int] = []
    while page := store.pending_events(limit=3):
        relayed += [seq for seq, _, _ in page]
        store.events_sent(page[-1][0])
        if len(relayed) == 3:  # committed while the relay is still paging through the table
            seqs.append(remember(store, "meanwhile").seq)
    assert relayed == seqs
    store.close()

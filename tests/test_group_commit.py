"""Group commit: concurrent remembers of a partition share one DuckDB transaction, each exactly
as if it had been alone (limits, superseding by key, seq, events), acknowledged once committed."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest

from memgate.contracts.errors import RateLimitedError
from memgate.runtime import Serial
from memgate.runtime.batching import GroupCommit
from memgate.storage import Filters, LimitReachedError, Limits, MemoryStore, Remember, Stored
from tests.conftest import Memgate, run_memgate

SUBJECT = "mem.evt.p0.memories"


def item(text: str, *, key: str | None = None, credential: str = "c1", subject: str = "m1",
         derived_from: tuple[Any, ...] = ()) -> Remember:
    return Remember(Filters("w1", subject, "notes", key), memory_id=str(uuid.uuid4()),
                    credential_id=credential, text=text, retention_days=30,
                    derived_from=derived_from)


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    return MemoryStore(tmp_path / "memories.duckdb")


def stored(outcomes: Sequence[Stored | Exception]) -> list[Stored]:
    return [o for o in outcomes if isinstance(o, Stored)]


def test_a_later_remember_of_a_key_in_the_same_group_supersedes_the_earlier(
    store: MemoryStore,
) -> None:
    [old] = stored(store.remember_group([item("old", key="k")]))
    first, second, _ = store.remember_group(
        [item("first", key="k"), item("second", key="k"), item("other", key="j")])
    assert isinstance(first, Stored) and isinstance(second, Stored)
    assert (first.superseded, second.superseded) == (1, 1)  # the old one, then the first
    live = store.versions(Filters("w1", "m1"), as_of=datetime.now(UTC), limit=10)
    assert sorted(r.text for r in live) == ["other", "second"]
    for version in (first, second):  # each was the live one from its creation on
        live = store.versions(Filters("w1", "m1", key="k"), as_of=version.created_at, limit=10)
        assert [r.memory_id for r in live] == [version.memory_id]
    assert old.seq < first.seq < second.seq


def test_limits_count_the_earlier_remembers_of_the_group(store: MemoryStore) -> None:
    limits = Limits(remembers_per_hour=3, versions_per_member=4)
    outcomes = store.remember_group([item(f"n{i}") for i in range(5)], limits)
    assert len(stored(outcomes)) == 3
    refused = [o for o in outcomes if isinstance(o, LimitReachedError)]
    assert [r.limit for r in refused] == ["rate", "rate"]
    assert all(r.retry_after is not None and 0 < r.retry_after <= 3600 for r in refused)
    outcomes = store.remember_group([item("a", credential="c2"), item("b", credential="c2")],
                                    limits)
    assert isinstance(outcomes[0], Stored)
    assert isinstance(outcomes[1], LimitReachedError) and outcomes[1].limit == "versions"
    other_member = store.remember_group([item("mine", credential="c3", subject="m2")], limits)
    assert isinstance(other_member[0], Stored)


def test_each_version_gets_its_own_seq_and_its_event_in_the_same_transaction(
    store: MemoryStore,
) -> None:
    group = stored(store.remember_group([item(f"n{i}") for i in range(20)]))
    later = stored(store.remember_group([item("later")]))
    seqs = [s.seq for s in group + later]
    assert seqs == sorted(set(seqs))
    events = store.pending_events()
    assert [seq for seq, _, _ in events] == seqs
    assert all(json.loads(payload)["seq"] == seq for seq, _, payload in events)
    assert [s.created_at for s in group] == sorted({s.created_at for s in group})


def test_an_item_that_fails_fails_alone(store: MemoryStore) -> None:
    unstorable = item("bad", derived_from=(object(),))  # no DuckDB value
    outcomes = store.remember_group([item("good"), unstorable, item("also good")])
    assert isinstance(outcomes[0], Stored) and isinstance(outcomes[2], Stored)
    assert isinstance(outcomes[1], duckdb.Error)
    texts = [text for _, text in store.texts("w1", "m1", None)]
    assert texts == ["good", "also good"]
    assert len(store.pending_events()) == 2


def test_a_group_survives_reopening_the_file(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path / "m.duckdb")
    group = stored(store.remember_group([item(f"n{i}") for i in range(10)]))
    store.close()
    reopened = MemoryStore(tmp_path / "m.duckdb")
    [after] = stored(reopened.remember_group([item("after")]))
    assert after.seq > max(s.seq for s in group)  # seq never repeats
    reopened.close()
    with duckdb.connect(str(tmp_path / "m.duckdb")) as db:
        assert db.execute("SELECT count(*) FROM memories").fetchone() == (11,)


def test_the_hourly_limit_counts_forgotten_remembers_across_reopening(tmp_path: Path) -> None:
    """A remember counts for an hour whether its version still exists or not; a file whose
    log holds every remember (written before the log kept only the deleted ones) counts each
    once."""
    path = tmp_path / "m.duckdb"
    limits = Limits(remembers_per_hour=6)
    store = MemoryStore(path)
    kept = stored(store.remember_group([item(f"n{i}") for i in range(4)], limits))
    store.delete("w1", "m1", memory_id=kept[0].memory_id, event_subject=SUBJECT,
                 event=lambda owner, ids: b"{}")
    store.close()
    with duckdb.connect(str(path)) as db:  # as a file from before: every remember logged
        db.execute("INSERT INTO remember_log SELECT credential_id, created_at FROM memories")
    store = MemoryStore(path)
    assert len(stored(store.remember_group([item("fifth"), item("sixth")], limits))) == 2
    [refused] = store.remember_group([item("seventh")], limits)
    assert isinstance(refused, LimitReachedError) and refused.retry_after is not None
    [other] = store.remember_group([item("another credential's", credential="c2")], limits)
    assert isinstance(other, Stored)
    store.close()


def test_seq_stays_above_a_deleted_newest_version_across_reopening(tmp_path: Path) -> None:
    """Remembers do not write the high-water mark; deleting the newest versions does."""
    path = tmp_path / "m.duckdb"
    store = MemoryStore(path)
    group = stored(store.remember_group([item(f"n{i}") for i in range(5)]))
    for version in group[2:]:
        store.delete("w1", "m1", memory_id=version.memory_id, event_subject=SUBJECT,
                     event=lambda owner, ids: b"{}")
    used = [s.seq for s in group] + [seq for seq, _, _ in store.pending_events()]
    store.events_sent(max(used))
    store.close()
    store = MemoryStore(path)
    [after] = stored(store.remember_group([item("after")]))
    assert after.seq > max(used)
    store.close()


async def test_what_arrives_during_a_commit_shares_the_next_one() -> None:
    started, release = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def commit(items: Sequence[int]) -> list[int | Exception]:
        batches.append(list(items))
        started.set()
        release.wait(10)
        return [i * 10 if i != 3 else ValueError("three") for i in items]

    serial = Serial("test-group")
    try:
        group = GroupCommit[int, int](serial, commit, cap=3)
        first = asyncio.ensure_future(group(0))
        assert await asyncio.to_thread(started.wait, 10)
        rest = [asyncio.ensure_future(group(i)) for i in range(1, 6)]
        release.set()
        results = await asyncio.gather(first, *rest, return_exceptions=True)
    finally:
        serial.shutdown()
    assert batches == [[0], [1, 2, 3], [4, 5]]
    assert results[:3] == [0, 10, 20]
    assert isinstance(results[3], ValueError)
    assert results[4:] == [40, 50]


async def test_concurrent_remembers_over_the_bus_are_each_acknowledged_once_committed(
    memgate: Memgate,
) -> None:
    owner = await memgate.workspace()
    agents = [await memgate.agent("bus", await memgate.credential(owner)) for _ in range(4)]
    results = await asyncio.gather(*(
        agent.remember("notes", f"note {i}", key=f"k{i % 3}")
        for i in range(40) for agent in agents))
    assert len({r.memory_id for r in results}) == 160
    listed = (await agents[0].list(limit=100)).memories
    assert sorted(m.key or "" for m in listed) == ["k0", "k1", "k2"]  # one live version per key
    assert {m.memory_id for m in listed} <= {r.memory_id for r in results}


async def test_the_rate_limit_is_exact_when_remembers_arrive_together(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, limit_remembers_per_hour=7)
        owner = await memgate.workspace()
        agent = await memgate.agent("bus", await memgate.credential(owner))

        async def remember(i: int) -> bool:
            try:
                await agent.remember("n", f"note {i}")
            except RateLimitedError:
                return False
            return True

        outcomes = await asyncio.gather(*(remember(i) for i in range(30)))
        assert outcomes.count(True) == 7


def test_limits_hold_across_a_restart_and_deleting_frees_room(tmp_path: Path) -> None:
    limits = Limits(remembers_per_hour=3, versions_per_member=2)
    store = MemoryStore(tmp_path / "m.duckdb")
    assert len(stored(store.remember_group([item("a"), item("b", credential="c2")], limits))) == 2
    store.close()
    store = MemoryStore(tmp_path / "m.duckdb")
    [full] = store.remember_group([item("c", credential="c3")], limits)
    assert isinstance(full, LimitReachedError) and full.limit == "versions"
    store.delete("w1", event_subject=SUBJECT, event=lambda owner, ids: b"{}")  # the workspace
    outcomes = store.remember_group([item("d"), item("e"), item("f")], limits)
    assert [type(o) for o in outcomes] == [Stored, Stored, LimitReachedError]
    assert isinstance(outcomes[2], LimitReachedError) and outcomes[2].limit == "rate"
    store.close()


def test_a_versions_event_is_built_from_its_row_until_it_was_sent(tmp_path: Path) -> None:
    """No outbox row per remember: after a restart the unsent versions' events are rebuilt
    from their rows, in seq order with the outbox's (deletions); what was sent is not."""
    path = tmp_path / "m.duckdb"
    store = MemoryStore(path, event_subject=SUBJECT)
    group = stored(store.remember_group([item(f"n{i}") for i in range(5)]))
    store.delete("w1", "m1", memory_id=group[4].memory_id, event_subject=SUBJECT,
                 event=lambda owner, ids: json.dumps({"deleted": ids}).encode())
    store.events_sent(group[1].seq)
    store.close()  # forgets what was sent
    with duckdb.connect(str(path)) as db:
        assert db.execute("SELECT count(*) FROM outbox").fetchone() == (1,)  # the deletion's
    reopened = MemoryStore(path, event_subject=SUBJECT)
    events = reopened.pending_events()
    assert [seq for seq, _, _ in events] == [s.seq for s in group[2:4]] + [group[4].seq + 1]
    assert {subject for _, subject, _ in events} == {SUBJECT}
    assert [json.loads(p).get("memory_id") for _, _, p in events[:2]] == [
        s.memory_id for s in group[2:4]]
    assert json.loads(events[2][2]) == {"deleted": [group[4].memory_id]}
    reopened.close()


def test_a_file_whose_remembers_queued_outbox_rows_publishes_each_once(tmp_path: Path) -> None:
    """A file from before (every remember's event in the outbox, no relayed mark): the
    outbox's events are sent, and not a second time from the rows."""
    path = tmp_path / "m.duckdb"
    store = MemoryStore(path)
    group = stored(store.remember_group([item(f"n{i}") for i in range(3)]))
    store.close()
    with duckdb.connect(str(path)) as db:
        db.execute("DROP TABLE relayed")
        db.execute("INSERT INTO outbox SELECT seq, 'old', '{}'::BLOB FROM memories")
    reopened = MemoryStore(path)
    assert [(seq, subject) for seq, subject, _ in reopened.pending_events()] == [
        (s.seq, "old") for s in group]
    [after] = stored(reopened.remember_group([item("after")]))
    assert [seq for seq, _, _ in reopened.pending_events()] == [s.seq for s in [*group, after]]
    reopened.close()

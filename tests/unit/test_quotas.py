"""Per-member quotas (`storage.quotas`): held and hourly counts, and the sessions file's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memgate.contracts.errors import MemorySpaceFullError, MemorySpaceRateLimitedError
from memgate.storage.quotas import Quota, Usage
from memgate.storage.sessions import NewEvent, SessionStore

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
KEY = ("ws", "mb")


def test_a_batch_waits_until_enough_of_the_hours_have_aged_out() -> None:
    usage = Usage(Quota("events", held=1000, per_hour=10), count=lambda key: 0,
                  made=lambda key, since: [])
    usage.took(KEY, 4, T0)
    usage.took(KEY, 4, T0 + timedelta(minutes=10))
    with pytest.raises(MemorySpaceRateLimitedError) as refused:
        usage.check(KEY, 5, T0 + timedelta(minutes=20))  # 8 + 5 > 10: the first 4 must go
    assert refused.value.details == {"limit": "eventsPerHour", "max": 10,
                                     "retryAfterSeconds": 40 * 60 + 1}
    usage.check(KEY, 2, T0 + timedelta(minutes=20))
    usage.check(KEY, 5, T0 + timedelta(minutes=60, seconds=1))
    usage.check(("ws", "another"), 10, T0 + timedelta(minutes=20))


def test_what_a_member_holds_is_counted_from_the_file_and_again_after_a_deletion() -> None:
    held = {KEY: 2}
    usage = Usage(Quota("sessions", held=3, per_hour=100), count=held.__getitem__,
                  made=lambda key, since: [])
    usage.check(KEY, 1, T0)
    usage.took(KEY, 1, T0)
    with pytest.raises(MemorySpaceFullError) as refused:
        usage.check(KEY, 1, T0)
    assert refused.value.details == {"limit": "sessions", "max": 3}
    held[KEY] = 1
    usage.stale([KEY])
    usage.check(KEY, 2, T0)


def test_the_sessions_file_keeps_each_members_events_quota_across_a_restart(
        tmp_path: Path) -> None:
    path, now = tmp_path / "sessions.duckdb", T0
    events = Quota("events", held=3, per_hour=100)
    hello = [NewEvent("user", "u", "message", '{"content":"hi"}')]
    store = SessionStore(path, events=events)
    session = store.create("sp", "ws", ["p"], "", [], now, None, created_by="mb")
    session = store.append(session, hello * 3, now, None, member_id="mb")[0]
    store.close()

    store = SessionStore(path, events=events)
    session = store.session(session.session_id) or session
    with pytest.raises(MemorySpaceFullError):
        store.append(session, hello, now, None, member_id="mb")
    session = store.append(session, hello, now, None, member_id="another")[0]
    with pytest.raises(MemorySpaceRateLimitedError):  # the hour's 3, loaded from the file
        store.events_usage.check(("ws", "mb"), 98, now)
    store.delete(session, now)
    store.append(store.create("sp", "ws", ["p"], "", [], now, None, created_by="mb"), hello * 3,
                 now, None, member_id="mb")
    store.close()

"""Sessions, events and lifecycle strategies of memory spaces (SPEC §4.2, §4.3, §4.5) over REST,
on the real bus, the real spaces actor and a real DuckDB file."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest

from memgate.actors.sessions import SessionsActor
from memgate.bus.connections import KindConnections
from memgate.policy.lifecycle import Rules
from tests.conftest import Llm, Member, Memgate, run_memgate
from tests.test_erased_bytes import canary, hits, needles

PARTICIPANT = "67500a000000000000000001"
AGENT = "67500a000000000000000002"
DAY = 24 * 3600
DEEP: Any = 1
for _ in range(40):
    DEEP = [DEEP]  # deeper than an event body may nest


async def call(memgate: Memgate, method: str, path: str, token: str | None,
               body: Any = None, headers: dict[str, str] | None = None) -> httpx.Response:
    sent = {"Authorization": f"Bearer {token}"} if token else {}
    return await memgate.http.request(method, path, json=body, headers={**sent, **(headers or {})})


async def ok(memgate: Memgate, method: str, path: str, token: str, body: Any = None,
             headers: dict[str, str] | None = None) -> Any:
    response = await call(memgate, method, path, token, body, headers)
    assert response.status_code == 200, response.text
    return response.json()


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return dict(error)


async def enable(memgate: Memgate, owner: Member, member: Member) -> None:
    await memgate.ok("PATCH", f"/api/w/{owner.workspace_id}/members/{member.member_id}",
                     owner.token, {"memorySpacesEnabled": True})


@dataclass
class Space:
    owner: Member
    space_id: str

    @property
    def sessions(self) -> str:
        return f"/memory/{self.space_id}/sessions"


async def new_space(memgate: Memgate, **body: Any) -> Space:
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    space = await memgate.ok("POST", "/memory/spaces", owner.token,
                             {"description": "support bot", **body})
    return Space(owner, space["id"])


async def new_session(memgate: Memgate, space: Space, **body: Any) -> dict[str, Any]:
    created: dict[str, Any] = await ok(memgate, "POST", space.sessions, space.owner.token,
                                       {"participants": [PARTICIPANT], **body})
    return created


def event(content: str, emitter: str = "user") -> dict[str, Any]:
    return {"body": {"content": content}, "emitter": {"type": emitter, "id": PARTICIPANT},
            "eventType": "message"}


# --- sessions ---


async def test_a_session_gets_the_default_soft_delete_strategy_and_version_1(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space, description="Triage chat #42")
    assert session["participants"] == [PARTICIPANT]
    assert session["description"] == "Triage chat #42"
    assert session["lifecycleStrategies"] == [
        {"type": "soft_delete", "trigger": {"ttl": 180 * DAY}}]
    assert session["version"] == 1
    assert session["spaceId"] == space.space_id
    response = await call(memgate, "GET", f"{space.sessions}/{session['id']}", space.owner.token)
    assert response.json() == session
    assert response.headers["ETag"] == '"1"'


BAD_PARTICIPANTS: list[Any] = [
    [], ["not-an-object-id"], ["67500a00000000000000001"], ["67500a0000000000000000012"],
    [PARTICIPANT, 5], "67500a000000000000000001", [PARTICIPANT] * 101, None,
]


async def test_participants_must_be_24_hex_object_ids(memgate: Memgate) -> None:
    space = await new_space(memgate)
    for participants in BAD_PARTICIPANTS:
        response = await call(memgate, "POST", space.sessions, space.owner.token,
                              {"participants": participants})
        assert response.status_code == 400, (participants, response.text)
        assert response.json()["error"]["code"] == "VALIDATION_ERROR"
    upper = await new_session(memgate, space, participants=[PARTICIPANT.upper(), PARTICIPANT])
    assert upper["participants"] == [PARTICIPANT]  # one id, however it is written


async def test_a_session_of_another_space_is_not_found(memgate: Memgate) -> None:
    space, other = await new_space(memgate), await new_space(memgate)
    session = await new_session(memgate, space)
    response = await call(memgate, "GET", f"{other.sessions}/{session['id']}",
                          other.owner.token)
    refused(response, 404, "NOT_FOUND")


async def test_the_description_is_masked(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space, description="chat with alice@example.com")
    assert session["description"] == "chat with [EMAIL]"


def on_disk(data_dir: Path) -> bytes:
    """Every byte of the sessions file (and its write-ahead log, if any)."""
    path = data_dir / "sessions.duckdb"
    wal = path.with_name(path.name + ".wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


async def test_a_deleted_session_and_its_events_are_gone(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}"
    await ok(memgate, "POST", f"{path}/events", space.owner.token, event("zanzibarcanary"))
    assert b"zanzibarcanary" in on_disk(memgate.settings.data_dir)
    await ok(memgate, "DELETE", path, space.owner.token)
    assert b"zanzibarcanary" not in on_disk(memgate.settings.data_dir)  # not one byte left
    refused(await call(memgate, "GET", path, space.owner.token), 404, "NOT_FOUND")
    refused(await call(memgate, "GET", f"{path}/events", space.owner.token), 404, "NOT_FOUND")
    refused(await call(memgate, "POST", f"{path}/events", space.owner.token, event("x")),
            404, "NOT_FOUND")


# --- events ---


async def test_events_get_sequence_ids_from_0_singly_and_in_batches(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}/events"
    first = await ok(memgate, "POST", path, space.owner.token,
                     event("Hello, my deployment is failing"))
    assert first["sequenceId"] == 0
    assert first["body"] == {"content": "Hello, my deployment is failing"}
    assert first["emitter"] == {"type": "user", "id": PARTICIPANT}
    assert first["eventType"] == "message"
    batch = await ok(memgate, "POST", path, space.owner.token, {"events": [
        event("Looking at it now.", "agent"), event("Found the issue - rolling back.", "agent")]})
    assert [e["sequenceId"] for e in batch["events"]] == [1, 2]
    listed = await ok(memgate, "GET", f"{path}?lastN=20", space.owner.token)
    assert [e["sequenceId"] for e in listed["events"]] == [0, 1, 2]
    assert listed["events"][1]["body"] == {"content": "Looking at it now."}


async def test_an_append_sent_again_under_its_idempotency_key_appends_nothing(
        memgate: Memgate) -> None:
    """A chat turn posted again after a lost answer (same `Idempotency-Key`) gets the events
    the first post stored and appends no second copy; another key appends."""
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}/events"
    once = {"Idempotency-Key": "turn-1"}
    first = await ok(memgate, "POST", path, space.owner.token, event("hello"), once)
    again = await ok(memgate, "POST", path, space.owner.token, event("hello"), once)
    batch = {"events": [event("a", "agent"), event("b", "agent")]}
    twice = {"Idempotency-Key": "turn-2"}
    batched = await ok(memgate, "POST", path, space.owner.token, batch, twice)
    batched_again = await ok(memgate, "POST", path, space.owner.token, batch, twice)
    other = await ok(memgate, "POST", path, space.owner.token, event("hello"),
                     {"Idempotency-Key": "turn-3"})
    assert again == first and first["sequenceId"] == 0
    assert batched_again == batched
    assert [e["sequenceId"] for e in batched["events"]] == [1, 2]
    assert other["sequenceId"] == 3
    listed = await ok(memgate, "GET", f"{path}?lastN=20", space.owner.token)
    assert [e["sequenceId"] for e in listed["events"]] == [0, 1, 2, 3]
    refused(await call(memgate, "POST", path, space.owner.token, event("x"),
                       {"Idempotency-Key": "k" * 256}), 400, "VALIDATION_ERROR")


async def test_a_space_or_session_created_again_under_its_idempotency_key_is_the_first(
        memgate: Memgate) -> None:
    """A create whose answer was lost, sent again with the same `Idempotency-Key`, gets what
    the first made (the same id, nothing more listed); another key, or another member's same
    key, makes one of its own; a key too long is refused before anything is made."""
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    other = await memgate.member(owner)
    await enable(memgate, owner, other)
    body = {"description": "support bot"}
    spaces = [await ok(memgate, "POST", "/memory/spaces", member.token, body,
                       {"Idempotency-Key": key})
              for member, key in ((owner, "space-1"), (owner, "space-1"), (owner, "space-2"),
                                  (other, "space-1"))]
    assert spaces[1] == spaces[0]
    assert len({s["id"] for s in spaces}) == 3
    listed = await ok(memgate, "GET", "/memory/spaces", owner.token)
    assert sorted(s["id"] for s in listed["spaces"]) == sorted(s["id"] for s in spaces[::2])
    refused(await call(memgate, "POST", "/memory/spaces", owner.token, body,
                       {"Idempotency-Key": "k" * 256}), 400, "VALIDATION_ERROR")

    space = Space(owner, spaces[0]["id"])
    created = [await ok(memgate, "POST", space.sessions, owner.token,
                        {"participants": [PARTICIPANT]}, {"Idempotency-Key": key})
               for key in ("session-1", "session-1", "session-2")]
    assert created[1]["id"] == created[0]["id"] != created[2]["id"]
    assert created[1]["version"] == created[0]["version"] == 1


async def test_last_n_returns_the_newest_n_oldest_first(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}/events"
    await ok(memgate, "POST", path, space.owner.token,
             {"events": [event(f"message {n}") for n in range(30)]})
    newest = await ok(memgate, "GET", f"{path}?lastN=5", space.owner.token)
    assert [e["sequenceId"] for e in newest["events"]] == [25, 26, 27, 28, 29]
    default = await ok(memgate, "GET", path, space.owner.token)
    assert [e["sequenceId"] for e in default["events"]] == list(range(10, 30))
    assert (await ok(memgate, "GET", f"{path}?lastN=200", space.owner.token))[
        "events"][0]["sequenceId"] == 0


async def test_a_batch_with_one_invalid_event_stores_none(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}/events"
    await ok(memgate, "POST", path, space.owner.token, event("before"))
    bad = event("broken")
    del bad["emitter"]
    response = await call(memgate, "POST", path, space.owner.token,
                          {"events": [event("a"), event("b"), bad, event("c")]})
    error = refused(response, 400, "VALIDATION_ERROR")
    assert any("events.2" in p["field"] for p in error["details"]["problems"])
    listed = await ok(memgate, "GET", path, space.owner.token)
    assert [e["body"]["content"] for e in listed["events"]] == ["before"]
    after = await ok(memgate, "POST", path, space.owner.token, event("after"))
    assert after["sequenceId"] == 1  # no gap where the refused batch would have been


async def test_a_batch_holds_at_most_200_events(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}/events"
    too_many = await call(memgate, "POST", path, space.owner.token,
                          {"events": [event(f"m{n}") for n in range(201)]})
    refused(too_many, 422, "UNPROCESSABLE")
    refused(await call(memgate, "POST", path, space.owner.token, {"events": []}),
            422, "UNPROCESSABLE")
    assert (await ok(memgate, "GET", path, space.owner.token))["events"] == []
    full = await ok(memgate, "POST", path, space.owner.token,
                    {"events": [event(f"m{n}") for n in range(200)]})
    assert [e["sequenceId"] for e in full["events"]] == list(range(200))


async def test_concurrent_appends_get_every_sequence_id_once_without_gaps(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}/events"

    async def single(n: int) -> list[int]:
        return [(await ok(memgate, "POST", path, space.owner.token, event(f"s{n}")))[
            "sequenceId"]]

    async def batch(n: int) -> list[int]:
        answer = await ok(memgate, "POST", path, space.owner.token,
                          {"events": [event(f"b{n}-{k}") for k in range(5)]})
        ids = [e["sequenceId"] for e in answer["events"]]
        assert ids == list(range(ids[0], ids[0] + 5))  # a batch is contiguous
        return ids

    results = await asyncio.gather(*(single(n) for n in range(40)),
                                   *(batch(n) for n in range(20)))
    issued = sorted(sequence for ids in results for sequence in ids)
    assert issued == list(range(140))
    listed = await ok(memgate, "GET", f"{path}?lastN=200", space.owner.token)
    assert [e["sequenceId"] for e in listed["events"]] == list(range(140))


async def test_event_bodies_are_masked_before_they_are_stored(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}/events"
    posted = await ok(memgate, "POST", path, space.owner.token, {
        "body": {"content": "mail me at alice@example.com",
                 "meta": {"cc": ["bob@example.org", 42, None, True]},
                 "carol@example.net": "a key"},
        "emitter": {"type": "user", "id": PARTICIPANT}, "eventType": "message"})
    assert posted["body"] == {"content": "mail me at [EMAIL]",
                              "meta": {"cc": ["[EMAIL]", 42, None, True]}, "[EMAIL]": "a key"}
    raw = duckdb_events(memgate.settings.data_dir)
    assert "alice@example.com" not in raw and "[EMAIL]" in raw


def duckdb_events(data_dir: Path) -> str:
    """What the file's events table holds, read while the actor has it open (a copy)."""
    return str(list(_copy_rows(data_dir / "sessions.duckdb")))


def _copy_rows(path: Path) -> list[tuple[Any, ...]]:
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "copy.duckdb"
        shutil.copy(path, copy)
        wal = path.with_name(path.name + ".wal")
        if wal.exists():
            shutil.copy(wal, copy.with_name(copy.name + ".wal"))
        with duckdb.connect(str(copy)) as db:
            return db.execute("SELECT tenant, subject_ids, classification, derived_from, "
                              "expires_at, legal_hold, body FROM events").fetchall()


async def test_event_rows_carry_the_erasure_fields(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space, participants=[PARTICIPANT, AGENT],
                                lifecycleStrategies=[{"type": "soft_delete",
                                                      "trigger": {"ttl": 7 * DAY}}])
    posted = await ok(memgate, "POST", f"{space.sessions}/{session['id']}/events",
                      space.owner.token, event("hello"))
    [(tenant, subjects, classification, derived_from, expires_at, legal_hold, _)] = \
        _copy_rows(memgate.settings.data_dir / "sessions.duckdb")
    assert tenant == space.owner.workspace_id
    assert subjects == [PARTICIPANT, AGENT]
    assert (classification, derived_from, legal_hold) == ("personal", [], False)
    created = datetime.fromisoformat(session["createdAt"])
    assert expires_at.replace(tzinfo=UTC) == created + timedelta(days=7)
    assert posted["createdAt"] >= session["createdAt"]


async def test_an_edit_with_a_stale_created_at_is_refused_with_412(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}/events"
    await ok(memgate, "POST", path, space.owner.token,
             {"events": [event("Hello"), event("Looking at it now.", "agent")]})
    [_, read] = (await ok(memgate, "GET", path, space.owner.token))["events"]

    edited = await ok(memgate, "PATCH", f"{path}/1", space.owner.token, {
        "body": {"content": "Looking at it now (ETA 5min)."}, "createdAt": read["createdAt"]})
    assert edited["body"] == {"content": "Looking at it now (ETA 5min)."}
    assert edited["sequenceId"] == 1 and edited["updatedAt"] > read["updatedAt"]

    stale = await call(memgate, "PATCH", f"{path}/1", space.owner.token, {
        "body": {"content": "an older copy's edit"}, "createdAt": read["createdAt"]})
    error = refused(stale, 412, "PRECONDITION_FAILED")
    assert error["details"]["updatedAt"] == edited["updatedAt"]

    fresh = await ok(memgate, "PATCH", f"{path}/1", space.owner.token, {
        "body": {"content": "re-read, then edited"}, "createdAt": edited["updatedAt"]})
    assert fresh["body"] == {"content": "re-read, then edited"}
    blind = await ok(memgate, "PATCH", f"{path}/0", space.owner.token,
                     {"body": {"content": "no check"}})
    assert blind["body"] == {"content": "no check"}
    listed = await ok(memgate, "GET", path, space.owner.token)
    assert [e["body"]["content"] for e in listed["events"]] == [
        "no check", "re-read, then edited"]

    refused(await call(memgate, "PATCH", f"{path}/7", space.owner.token, {"body": {}}),
            404, "NOT_FOUND")
    for bad in ("-1", "abc", "1.5", "9" * 30):
        refused(await call(memgate, "PATCH", f"{path}/{bad}", space.owner.token, {"body": {}}),
                400, "VALIDATION_ERROR")


# --- lifecycle strategies ---


def strategy(kind: str = "soft_delete", **trigger: Any) -> dict[str, Any]:
    return {"type": kind, "trigger": trigger or {"ttl": DAY}}


async def test_patch_replaces_the_strategies_bumps_the_version_and_honours_if_match(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}"
    updated = await ok(memgate, "PATCH", path, space.owner.token,
                       {"lifecycleStrategies": [strategy(idle=3600)]}, {"If-Match": '"1"'})
    assert updated["version"] == 2
    assert updated["lifecycleStrategies"] == [strategy(idle=3600)]
    stale = await call(memgate, "PATCH", path, space.owner.token,
                       {"lifecycleStrategies": [strategy(ttl=60)]}, {"If-Match": '"1"'})
    assert refused(stale, 412, "PRECONDITION_FAILED")["details"]["version"] == 2
    described = await ok(memgate, "PATCH", path, space.owner.token,
                         {"description": "renamed"}, {"If-Match": "2"})
    assert described["version"] == 3
    assert described["lifecycleStrategies"] == [strategy(idle=3600)]  # omitted: kept
    assert described["description"] == "renamed"
    refused(await call(memgate, "PATCH", path, space.owner.token, {"description": "x"},
                       {"If-Match": "soon"}), 400, "VALIDATION_ERROR")
    refused(await call(memgate, "DELETE", path, space.owner.token, None, {"If-Match": '"2"'}),
            412, "PRECONDITION_FAILED")


STRATEGY_RULES: list[tuple[Any, int]] = [
    (None, 422), ([], 422),
    ([strategy(ttl=DAY * (n + 1)) for n in range(6)], 422),
    ([strategy(ttl=DAY), strategy(idle=DAY)], 422),  # the same type twice
    ([strategy(never=True)], 422),  # never is not enabled on this installation
    ([strategy(ttl=3 * 365 * DAY)], 422),  # above the maximum (2 years)
    ([strategy(idle=10**30)], 422),
    ([strategy("extract_memories", ttl=DAY)], 422),  # the space has no LLM
    ([strategy(ttl=-5)], 400), ([strategy(ttl=0)], 400), ([strategy(ttl="soon")], 400),
    ([strategy(ttl=True)], 400), ([{"type": "soft_delete", "trigger": {}}], 400),
    ([{"type": "soft_delete", "trigger": {"ttl": 5, "idle": 5}}], 400),
    ([{"type": "archive", "trigger": {"ttl": 5}}], 400), ("soft_delete", 400),
]


async def test_strategy_rules_are_enforced_on_update(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}"
    for strategies, status in STRATEGY_RULES:
        response = await call(memgate, "PATCH", path, space.owner.token,
                              {"lifecycleStrategies": strategies})
        assert response.status_code == status, (strategies, response.text)
        assert response.json()["error"]["code"] == (
            "UNPROCESSABLE" if status == 422 else "VALIDATION_ERROR")
    again = await ok(memgate, "GET", path, space.owner.token)
    assert again["version"] == 1  # nothing changed


async def test_strategy_rules_are_enforced_at_creation(memgate: Memgate) -> None:
    space = await new_space(memgate)
    for strategies in ([], [strategy(never=True)], [strategy("extract_memories")],
                       [strategy(), strategy()]):
        response = await call(memgate, "POST", space.sessions, space.owner.token,
                              {"participants": [PARTICIPANT],
                               "lifecycleStrategies": strategies})
        refused(response, 422, "UNPROCESSABLE")
    five_at_most = await new_session(memgate, space, lifecycleStrategies=[strategy(ttl=60)])
    assert five_at_most["lifecycleStrategies"] == [strategy(ttl=60)]


async def test_extract_memories_is_allowed_in_a_space_with_an_llm(memgate: Memgate) -> None:
    space = await new_space(memgate, llmModelName="gpt-4o-mini",
                            llmBaseUrl="http://127.0.0.1:9/v1")
    session = await new_session(memgate, space, lifecycleStrategies=[
        strategy("extract_memories", idle=3600), strategy(ttl=7 * DAY)])
    assert [s["type"] for s in session["lifecycleStrategies"]] == [
        "extract_memories", "soft_delete"]


# --- permissions ---


async def test_a_consumer_reads_but_cannot_write_and_a_revoked_share_is_404_at_once(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    owner = space.owner
    reader, writer = await memgate.member(owner, "viewer"), await memgate.member(owner, "editor")
    for member in (reader, writer):
        await enable(memgate, owner, member)
    shares = f"/memory/spaces/{space.space_id}/shares"
    await memgate.ok("PUT", f"{shares}/{reader.member_id}", owner.token, {"role": "consumer"})
    await memgate.ok("PUT", f"{shares}/{writer.member_id}", owner.token, {"role": "editor"})
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}"
    await ok(memgate, "POST", f"{path}/events", owner.token, event("hi"))

    assert (await ok(memgate, "GET", path, reader.token))["id"] == session["id"]
    assert len((await ok(memgate, "GET", f"{path}/events", reader.token))["events"]) == 1
    for method, route, body in (
            ("POST", f"{path}/events", event("from a consumer")),
            ("POST", f"{path}/events", {"events": [event("x")]}),
            ("PATCH", f"{path}/events/0", {"body": {}}),
            ("PATCH", path, {"description": "mine"}),
            ("POST", space.sessions, {"participants": [PARTICIPANT]}),
            ("DELETE", path, None)):
        refused(await call(memgate, method, route, reader.token, body), 403, "FORBIDDEN")

    written = await ok(memgate, "POST", f"{path}/events", writer.token, event("editor"))
    assert written["sequenceId"] == 1
    await ok(memgate, "POST", space.sessions, writer.token, {"participants": [PARTICIPANT]})
    refused(await call(memgate, "DELETE", path, writer.token), 403, "FORBIDDEN")

    await memgate.ok("DELETE", f"{shares}/{reader.member_id}", owner.token)
    refused(await call(memgate, "GET", path, reader.token), 404, "NOT_FOUND")
    refused(await call(memgate, "GET", f"{path}/events", reader.token), 404, "NOT_FOUND")
    refused(await call(memgate, "GET", path, None), 401, "UNAUTHENTICATED")


async def test_a_member_without_the_flag_is_refused(memgate: Memgate) -> None:
    space = await new_space(memgate)
    member = await memgate.member(space.owner, "editor")
    response = await call(memgate, "POST", space.sessions, member.token,
                          {"participants": [PARTICIPANT]})
    refused(response, 403, "MEMORY_SPACES_DISABLED")


# --- hostile input ---


HOSTILE: list[tuple[str, str, Any]] = [
    ("POST", "", b"{not json"),
    ("POST", "", [1, 2]),
    ("POST", "", {"participants": [PARTICIPANT], "surprise": 1}),
    ("POST", "", {"participants": [PARTICIPANT], "description": "x" * 5000}),
    ("POST", "/SESSION/events", b"{"),
    ("POST", "/SESSION/events", {"events": "many"}),
    ("POST", "/SESSION/events", {"events": [1, 2]}),
    ("POST", "/SESSION/events", {"body": {}, "emitter": {"type": "user"}, "eventType": "m"}),
    ("POST", "/SESSION/events", {"body": {}, "emitter": {"type": "u s", "id": "1"},
                                 "eventType": "m"}),
    ("POST", "/SESSION/events", {"body": {"c": "x" * 40_000}, "emitter": {"type": "u", "id": "1"},
                                 "eventType": "m"}),
    ("POST", "/SESSION/events", {"body": {"a": DEEP}, "emitter": {"type": "u", "id": "1"},
                                 "eventType": "m"}),
    ("POST", "/SESSION/events", b'{"body": ' + b"[" * 5000 + b"]" * 5000 +
     b', "emitter": {"type": "u", "id": "1"}, "eventType": "m"}'),
    ("GET", "/SESSION/events?lastN=0", None),
    ("GET", "/SESSION/events?lastN=201", None),
    ("GET", "/SESSION/events?lastN=abc", None),
    ("PATCH", "/SESSION/events/0", {"body": {}, "createdAt": "yesterday"}),
    ("PATCH", "/SESSION/events/0", {"body": {}, "createdAt": "99999-01-01T00:00:00Z"}),
    ("PATCH", "/SESSION/events/0", {}),
    ("PATCH", "/SESSION/events/x", {"body": {}}),
    ("PATCH", "/SESSION", {"lifecycleStrategies": [{"type": "soft_delete",
                                                     "trigger": {"ttl": 10**400}}]}),
    ("PATCH", "/SESSION", {"version": 7}),
    ("PATCH", "/SESSION", "text"),
    ("GET", "/" + "x" * 300, None),
]


async def test_malformed_session_requests_are_refused_in_the_error_shape(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    await ok(memgate, "POST", f"{space.sessions}/{session['id']}/events", space.owner.token,
             event("hello"))
    for method, route, body in HOSTILE:
        path = space.sessions + route.replace("SESSION", session["id"])
        content = body if isinstance(body, bytes) else None
        kwargs: dict[str, Any] = {"content": content} if content is not None else {"json": body}
        anonymous = await memgate.http.request(method, path, **kwargs)
        assert anonymous.status_code == 401, (method, route, anonymous.text)
        response = await memgate.http.request(
            method, path, headers={"Authorization": f"Bearer {space.owner.token}",
                                   "Content-Type": "application/json"}, **kwargs)
        assert 400 <= response.status_code < 500, (method, route, response.text)
        assert set(response.json()["error"]) == {"code", "message", "details"}
    listed = await ok(memgate, "GET", f"{space.sessions}/{session['id']}/events",
                      space.owner.token)
    assert [e["body"] for e in listed["events"]] == [{"content": "hello"}]  # nothing changed


async def test_an_oversized_body_is_refused_with_413(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    response = await call(memgate, "POST", f"{space.sessions}/{session['id']}/events",
                          space.owner.token, {"events": [
                              {**event("x" * 30_000)} for _ in range(200)]})
    refused(response, 413, "PAYLOAD_TOO_LARGE")


# --- the lifecycle, on the clock ---


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class OnTheClock:
    memgate: Memgate
    clock: Clock
    actor: SessionsActor


@pytest.fixture
async def timed(tmp_path: Path) -> AsyncIterator[OnTheClock]:
    """memgate whose sessions actor runs on a clock the test moves (never by sleeping)."""
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, skip=frozenset({"sessions"}),
                                    mem0_extract_llm_timeout_s=2.0)
        clock = Clock()
        kinds = KindConnections(memgate.bus, timeout=10.0)
        await kinds.connect("sessions", stack)
        actor = SessionsActor(path=memgate.settings.data_dir / "sessions.duckdb",
                              bus=kinds.client("sessions"), now=clock, interval_s=None,
                              rules=Rules(never_enabled=True))
        await actor.start()
        stack.push_async_callback(actor.stop)
        broker = kinds.broker("sessions", graceful_timeout=5.0)
        broker.include_router(actor.router())
        await broker.start()
        stack.push_async_callback(broker.stop)
        await broker.connection.flush()
        yield OnTheClock(memgate, clock, actor)


async def test_soft_delete_by_ttl_hides_the_session_and_its_events_at_once(
        timed: OnTheClock) -> None:
    memgate, clock = timed.memgate, timed.clock
    space = await new_space(memgate)
    session = await new_session(memgate, space, lifecycleStrategies=[strategy(ttl=3600)])
    path = f"{space.sessions}/{session['id']}"
    await ok(memgate, "POST", f"{path}/events", space.owner.token, event("hello"))

    clock.advance(3599)
    assert await timed.actor.run_due() == []
    assert (await ok(memgate, "GET", path, space.owner.token))["lifecycleRuns"] == []
    clock.advance(1)
    assert await timed.actor.run_due() == [(session["id"], "soft_delete")]
    for route in (path, f"{path}/events"):
        refused(await call(memgate, "GET", route, space.owner.token), 404, "NOT_FOUND")
    refused(await call(memgate, "POST", f"{path}/events", space.owner.token, event("late")),
            404, "NOT_FOUND")
    assert await timed.actor.run_due() == []  # it ran once


async def test_idle_counts_from_the_last_event(timed: OnTheClock) -> None:
    memgate, clock = timed.memgate, timed.clock
    space = await new_space(memgate)
    session = await new_session(memgate, space, lifecycleStrategies=[strategy(idle=600)])
    path = f"{space.sessions}/{session['id']}"
    clock.advance(500)
    await ok(memgate, "POST", f"{path}/events", space.owner.token, event("still here"))
    clock.advance(500)  # 1000 s after creation, 500 s after the last event
    assert await timed.actor.run_due() == []
    assert (await ok(memgate, "GET", path, space.owner.token))["lastEventAt"]
    clock.advance(100)
    assert await timed.actor.run_due() == [(session["id"], "soft_delete")]
    refused(await call(memgate, "GET", path, space.owner.token), 404, "NOT_FOUND")


async def test_never_keeps_a_session_out_of_the_lifecycle(timed: OnTheClock) -> None:
    memgate, clock = timed.memgate, timed.clock
    space = await new_space(memgate)
    session = await new_session(memgate, space, lifecycleStrategies=[strategy(never=True)])
    clock.advance(10 * 365 * DAY)
    assert await timed.actor.run_due() == []
    path = f"{space.sessions}/{session['id']}"
    assert (await ok(memgate, "GET", path, space.owner.token))["version"] == 1
    moved = await ok(memgate, "PATCH", path, space.owner.token,
                     {"lifecycleStrategies": [strategy(ttl=60)]})  # never → ttl: allowed
    assert moved["lifecycleStrategies"] == [strategy(ttl=60)]
    assert await timed.actor.run_due() == [(session["id"], "soft_delete")]  # long past due


async def test_a_strategy_update_moves_the_deadline(timed: OnTheClock) -> None:
    memgate, clock = timed.memgate, timed.clock
    space = await new_space(memgate)
    session = await new_session(memgate, space, lifecycleStrategies=[strategy(ttl=60)])
    path = f"{space.sessions}/{session['id']}"
    await ok(memgate, "PATCH", path, space.owner.token,
             {"lifecycleStrategies": [strategy(ttl=DAY)]})
    clock.advance(120)
    assert await timed.actor.run_due() == []
    assert (await ok(memgate, "GET", path, space.owner.token))["version"] == 2


async def test_the_erasure_actor_reaches_a_participants_conversation_logs(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    await ok(memgate, "POST", f"{space.sessions}/{session['id']}/events", space.owner.token,
             event("hello quokkacanary"))
    erasure = await memgate.internal("erasure")  # on the erasure actor's own NATS login
    target = {"tenant": space.owner.workspace_id, "externalId": PARTICIPANT}
    found = await erasure.request("mem.int.sessions.subject", json.dumps(target).encode(),
                                  timeout=5)
    assert json.loads(found.data)["result"]["recordIds"] == [session["id"], f"{session['id']}/0"]
    erased = await erasure.request("mem.int.sessions.subject",
                                   json.dumps({**target, "erase": True}).encode(), timeout=5)
    assert json.loads(erased.data)["result"]["count"] == 2
    refused(await call(memgate, "GET", f"{space.sessions}/{session['id']}", space.owner.token),
            404, "NOT_FOUND")
    assert "quokkacanary" not in duckdb_events(memgate.settings.data_dir)
    assert b"quokkacanary" not in on_disk(memgate.settings.data_dir)
    assert PARTICIPANT.encode() not in on_disk(memgate.settings.data_dir)


async def test_extract_memories_moves_the_masked_conversation_into_the_space_once(
        timed: OnTheClock, llm: Llm) -> None:
    """On real components: the space-memories actor, and an OpenAI-compatible server in a
    process of its own. Failures leave nothing behind and are retried after the backoff."""
    memgate, clock = timed.memgate, timed.clock
    space = await new_space(memgate, llmModelName="gpt-4o-mini", llmBaseUrl=llm.url)
    session = await new_session(memgate, space, lifecycleStrategies=[
        strategy("extract_memories", idle=600), strategy(ttl=30 * DAY)])
    path = f"{space.sessions}/{session['id']}"
    await ok(memgate, "POST", f"{path}/events", space.owner.token, {"events": [
        event("I moved to Haifa, write to alex.doe@example.com"),
        event("Welcome to Haifa!", "agent")]})

    async def memories() -> list[str]:
        page = await ok(memgate, "POST", f"/memory/{space.space_id}/v3/memories/?page_size=50",
                        space.owner.token, {"filters": {"run_id": session["id"]}})
        return sorted(m["memory"] for m in page["results"])

    await llm.mode("5xx")
    clock.advance(600)
    assert await timed.actor.run_due() == []
    assert (await ok(memgate, "GET", path, space.owner.token))["lifecycleRuns"] == []
    assert await memories() == []  # nothing half-extracted
    await llm.mode("ok")
    clock.advance(29)  # the first retry waits 30 s
    assert await timed.actor.run_due() == []
    clock.advance(1)
    assert await timed.actor.run_due() == [(session["id"], "extract_memories")]
    assert await memories() == ["I moved to Haifa, write to [EMAIL]", "Welcome to Haifa!"]
    assert "alex.doe@example.com" not in await llm.received()
    seen = await ok(memgate, "GET", path, space.owner.token)
    assert [run["type"] for run in seen["lifecycleRuns"]] == ["extract_memories"]
    clock.advance(3600)
    assert await timed.actor.run_due() == []  # once
    changed = await call(memgate, "PATCH", path, space.owner.token, {"lifecycleStrategies": [
        strategy("extract_memories", idle=60), strategy(ttl=30 * DAY)]})
    assert refused(changed, 409, "CONFLICT")["details"]["type"] == "extract_memories"


# --- deleted means gone (SPEC §5.4): session events leave every byte ---


async def test_an_edited_events_old_body_leaves_the_file(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    path = f"{space.sessions}/{session['id']}/events"
    secret = canary()
    await ok(memgate, "POST", path, space.owner.token, event(f"my pin word is {secret}"))
    data = memgate.settings.data_dir
    assert hits(data, needles(secret)) != []  # the scan sees it while it is there
    await memgate.ok("PATCH", f"{path}/0", space.owner.token, {"body": {"content": "redacted"}})
    assert hits(data, needles(secret)) == []


async def test_a_deleted_spaces_sessions_and_events_leave_the_disk(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    secret = canary()
    await ok(memgate, "POST", f"{space.sessions}/{session['id']}/events", space.owner.token,
             event(f"the vault word is {secret}"))
    await memgate.ok("DELETE", f"/memory/spaces/{space.space_id}", space.owner.token)
    assert hits(memgate.settings.data_dir, needles(secret)) == []


async def test_a_soft_deleted_session_leaves_the_disk_after_the_grace_period(
        timed: OnTheClock) -> None:
    memgate, clock = timed.memgate, timed.clock
    space = await new_space(memgate)
    session = await new_session(memgate, space, lifecycleStrategies=[strategy(ttl=3600)])
    secret = canary()
    await ok(memgate, "POST", f"{space.sessions}/{session['id']}/events", space.owner.token,
             event(f"the door word is {secret}"))
    clock.advance(3600)
    assert await timed.actor.run_due() == [(session["id"], "soft_delete")]
    data = memgate.settings.data_dir
    assert hits(data, needles(secret)) != []  # hidden from reads, kept for the grace period
    clock.advance(30 * DAY - 1)
    await timed.actor.run_due()
    assert hits(data, needles(secret)) != []
    clock.advance(1)
    await timed.actor.run_due()
    assert hits(data, needles(secret)) == []

"""Quotas that hold across spaces (SPEC §3.9, §4; #28 finding 9), on the real app: the version
cap is a member's, across their agent memories and every space they write; spaces, sessions and
events are capped and rate-limited per member; a refused mem0 add leaves no entity behind.

The limits are set the way an operator sets them, as `MEMGATE_LIMIT_*` variables."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from memgate.bus import BusClient, subjects
from memgate.contracts.errors import AgentMemoryFullError
from memgate.contracts import Done
from memgate.contracts.internal import Owner, StoreRemember, space_owner
from memgate.contracts.spaces import (
    Entities, EntitiesRequest, Entity, EntityRequest, EntitySettled, Scope, ScopeRequest,
)
from memgate.ports.storage import BusStorage
from tests.conftest import Member, Memgate, run_memgate
from tests.test_erased_bytes import canary, hits, needles
from tests.test_erasure import erase
from tests.test_spaces import enable, space_of

PARTICIPANT = "67500a000000000000000001"


class Started:
    """Start a memgate with some limits set (`MEMGATE_LIMIT_<NAME>`), closed after the test."""

    def __init__(self, tmp_path: Path, stack: AsyncExitStack,
                 monkeypatch: pytest.MonkeyPatch) -> None:
        self._tmp_path, self._stack, self._env = tmp_path, stack, monkeypatch

    async def __call__(self, **limits: int) -> Memgate:
        for name, value in limits.items():
            self._env.setenv(f"MEMGATE_LIMIT_{name.upper()}", str(value))
        return await run_memgate(self._tmp_path, self._stack)


@pytest.fixture
async def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Started]:
    async with AsyncExitStack() as stack:
        yield Started(tmp_path, stack, monkeypatch)


async def call(memgate: Memgate, method: str, path: str, member: Member,
               body: Any = None) -> httpx.Response:
    return await memgate.http.request(method, path, json=body,
                                      headers={"Authorization": f"Bearer {member.token}"})


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return dict(error)


async def add(memgate: Memgate, member: Member, space_id: str, text: str,
              user_id: str = "alex") -> httpx.Response:
    """A mem0 add of one message, stored verbatim (the space has no LLM): one version."""
    return await call(memgate, "POST", f"/memory/{space_id}/v3/memories/add/", member, {
        "messages": [{"role": "user", "content": text}], "user_id": user_id})


async def added(memgate: Memgate, member: Member, space_id: str, text: str,
                user_id: str = "alex") -> str:
    response = await add(memgate, member, space_id, text, user_id)
    assert response.status_code == 200, response.text
    return str(response.json()["results"][0]["id"])


async def stored(memgate: Memgate, member: Member, space_id: str) -> list[str]:
    found = await call(memgate, "POST", f"/memory/{space_id}/v3/memories/", member, {})
    assert found.status_code == 200, found.text
    return sorted(m["memory"] for m in found.json()["results"])


async def spaces_member(memgate: Memgate, owner: Member, role: str = "editor") -> Member:
    member = await memgate.member(owner, role)
    await enable(memgate, owner, member)
    return member


async def share(memgate: Memgate, owner: Member, space_id: str, member: Member) -> None:
    response = await call(memgate, "PUT", f"/memory/spaces/{space_id}/shares/{member.member_id}",
                          owner, {"role": "editor"})
    assert response.status_code == 200, response.text


# --- the version cap: one member's, across all of their storage ---


async def test_a_members_versions_are_counted_across_agent_memories_and_every_space(
        start: Started) -> None:
    memgate = await start(versions_per_member=12)
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    agent = await memgate.agent("rest", await memgate.credential(owner))
    first, second, third = [(await space_of(memgate, owner))["id"] for _ in range(3)]
    for i in range(4):
        await agent.remember("notes", f"the deploy runs on day {i}")
        await added(memgate, owner, first, f"the first space's note {i}")
        await added(memgate, owner, second, f"the second space's note {i}")

    with pytest.raises(AgentMemoryFullError):
        await agent.remember("notes", "one more agent memory")
    for space_id in (first, second, third):
        error = refused(await add(memgate, owner, space_id, "one more space memory"), 409,
                        "AGENT_MEMORY_FULL")
        assert error["details"] == {"limit": 12}
    assert len(await stored(memgate, owner, first)) == 4
    assert await stored(memgate, owner, third) == []


async def test_one_editor_filling_a_shared_space_leaves_the_others_their_own_versions(
        start: Started) -> None:
    memgate = await start(versions_per_member=12)
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    editor = await spaces_member(memgate, owner)
    space_id = (await space_of(memgate, owner))["id"]
    await share(memgate, owner, space_id, editor)
    for i in range(12):
        await added(memgate, owner, space_id, f"the owner's note {i}")
    refused(await add(memgate, owner, space_id, "the owner's 13th"), 409, "AGENT_MEMORY_FULL")

    await added(memgate, editor, space_id, "the editor's first note")
    assert "the editor's first note" in await stored(memgate, editor, space_id)


async def test_a_refused_mem0_add_creates_no_entity(start: Started) -> None:
    memgate = await start(versions_per_member=1)
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    space_id = (await space_of(memgate, owner))["id"]
    bus = BusClient(await memgate.internal("space-memories"))

    async def entities() -> list[str]:
        """The space's entity rows, as the spaces actor resolves a filter and names them."""
        scope = await bus.request(subjects.spaces_internal("scope"), ScopeRequest(
            space_id=space_id, filters={"user_id": "*"}), Scope)
        found = await bus.request(subjects.spaces_internal("entities"), EntitiesRequest(
            space_id=space_id, namespaces=scope.namespaces), Entities)
        return sorted(str(e.user_id) for e in found.entities)

    memory_id = await added(memgate, owner, space_id, "the first user's note", "user-0")
    for i in range(1, 16):
        refused(await add(memgate, owner, space_id, "refused", f"user-{i}"), 409,
                "AGENT_MEMORY_FULL")
    assert await entities() == ["user-0"]
    assert hits(memgate.settings.data_dir, [b"user-15"]) == []  # nor its id, in any byte

    deleted = await call(memgate, "DELETE", f"/memory/{space_id}/v1/memories/{memory_id}/", owner)
    assert deleted.status_code == 200, deleted.text
    await added(memgate, owner, space_id, "accepted now", "user-1")
    assert await entities() == ["user-0", "user-1"]


async def test_an_end_user_whose_add_stopped_before_its_settle_is_still_erased(
        tmp_path: Path) -> None:
    """The space-memories actor's part of a new entity's add, played over the bus up to the
    store; then memgate stops before the settle, as a crash there would. After a restart the
    memory is shown, and the erasure of its end user finds it and removes it."""
    user, secret = "64b7f0c2a1b2c3d4e5f607cc", canary()
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        owner = await memgate.workspace()
        await enable(memgate, owner, owner)
        space_id = (await space_of(memgate, owner))["id"]
        bus = BusClient(await memgate.internal("space-memories"))
        issued = await bus.request(subjects.spaces_internal("entity"), EntityRequest(
            space_id=space_id, entity=Entity(user_id=user)), Entity)
        assert issued.namespace is not None
        writer = space_owner(space_id)
        await BusStorage(bus, partitions=memgate.settings.partitions).remember(StoreRemember(
            owner=Owner(tenant=owner.workspace_id, subject_id=writer),
            member_id=owner.member_id, credential_id=f"{writer}:{owner.member_id}",
            namespace=issued.namespace, key=uuid.uuid4().hex, text=f"my locker word is {secret}",
            retention_days=90))
        # no settle: the process ends here

    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        assert await stored(memgate, owner, space_id) == [f"my locker word is {secret}"]
        result = await erase(memgate, {"externalId": user}, owner.workspace_id)
        assert result["discovered"]["discovery"]["memory_store"] == 1
        assert await stored(memgate, owner, space_id) == []
        assert hits(memgate.settings.data_dir, [*needles(secret), user.encode()]) == []


# --- spaces, sessions and events: capped and rate-limited per member ---


async def test_spaces_are_capped_and_rate_limited_per_member(start: Started) -> None:
    memgate = await start(spaces_per_member=2, spaces_per_hour=3)
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    other = await spaces_member(memgate, owner)
    kept = (await space_of(memgate, owner))["id"]
    dropped = (await space_of(memgate, owner))["id"]
    error = refused(await call(memgate, "POST", "/memory/spaces", owner, {"description": "x"}),
                    409, "MEMORY_SPACE_FULL")
    assert error["details"] == {"limit": "spaces", "max": 2}
    await space_of(memgate, other)  # another member's are their own

    assert (await call(memgate, "DELETE", f"/memory/spaces/{dropped}", owner)).status_code == 200
    third = (await space_of(memgate, owner))["id"]  # held again: 2, made this hour: 3
    assert (await call(memgate, "DELETE", f"/memory/spaces/{third}", owner)).status_code == 200
    response = await call(memgate, "POST", "/memory/spaces", owner, {"description": "x"})
    error = refused(response, 429, "MEMORY_SPACE_RATE_LIMITED")
    assert error["details"]["limit"] == "spacesPerHour"
    assert error["details"]["max"] == 3
    assert 0 < int(response.headers["Retry-After"]) <= 3600
    assert (await call(memgate, "GET", f"/memory/spaces/{kept}", owner)).status_code == 200


async def new_session(memgate: Memgate, member: Member, space_id: str) -> httpx.Response:
    return await call(memgate, "POST", f"/memory/{space_id}/sessions", member,
                      {"participants": [PARTICIPANT]})


async def test_sessions_are_capped_per_member(start: Started) -> None:
    memgate = await start(sessions_per_member=3)
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    editor = await spaces_member(memgate, owner)
    space_id = (await space_of(memgate, owner))["id"]
    await share(memgate, owner, space_id, editor)
    sessions = [(await new_session(memgate, owner, space_id)).json()["id"] for _ in range(3)]
    error = refused(await new_session(memgate, owner, space_id), 409, "MEMORY_SPACE_FULL")
    assert error["details"] == {"limit": "sessions", "max": 3}
    assert (await new_session(memgate, editor, space_id)).status_code == 200

    gone = await call(memgate, "DELETE", f"/memory/{space_id}/sessions/{sessions[0]}", owner)
    assert gone.status_code == 200, gone.text
    assert (await new_session(memgate, owner, space_id)).status_code == 200


async def test_sessions_are_rate_limited_per_member(start: Started) -> None:
    memgate = await start(sessions_per_hour=3)
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    space_id = (await space_of(memgate, owner))["id"]
    for _ in range(3):  # deleting a session does not give its place in the hour back
        session = (await new_session(memgate, owner, space_id)).json()["id"]
        gone = await call(memgate, "DELETE", f"/memory/{space_id}/sessions/{session}", owner)
        assert gone.status_code == 200, gone.text
    response = await new_session(memgate, owner, space_id)
    error = refused(response, 429, "MEMORY_SPACE_RATE_LIMITED")
    assert error["details"]["limit"] == "sessionsPerHour"
    assert 0 < error["details"]["retryAfterSeconds"] <= 3600
    assert response.headers["Retry-After"] == str(error["details"]["retryAfterSeconds"])


def events(count: int, content: str = "hello") -> dict[str, Any]:
    return {"events": [{"body": {"content": f"{content} {i}"},
                        "emitter": {"type": "user", "id": PARTICIPANT}, "eventType": "message"}
                       for i in range(count)]}


async def test_events_are_capped_per_member(start: Started) -> None:
    memgate = await start(events_per_member=50)
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    editor = await spaces_member(memgate, owner)
    space_id = (await space_of(memgate, owner))["id"]
    await share(memgate, owner, space_id, editor)
    session = (await new_session(memgate, owner, space_id)).json()["id"]
    path = f"/memory/{space_id}/sessions/{session}/events"

    outcomes = [(await call(memgate, "POST", path, owner, events(50))).status_code
                for _ in range(6)]  # 300 events, one batch of them held
    assert outcomes == [200, 409, 409, 409, 409, 409]
    error = refused(await call(memgate, "POST", path, owner, events(1)["events"][0]), 409,
                    "MEMORY_SPACE_FULL")
    assert error["details"] == {"limit": "events", "max": 50}
    assert (await call(memgate, "POST", path, editor, events(1))).status_code == 200
    listed = await call(memgate, "GET", f"{path}?lastN=200", owner)
    assert len(listed.json()["events"]) == 51

    gone = await call(memgate, "DELETE", f"/memory/{space_id}/sessions/{session}", owner)
    assert gone.status_code == 200, gone.text
    again = (await new_session(memgate, owner, space_id)).json()["id"]
    posted = await call(memgate, "POST", f"/memory/{space_id}/sessions/{again}/events", owner,
                        events(50))
    assert posted.status_code == 200, posted.text


async def test_events_are_rate_limited_per_member(start: Started) -> None:
    memgate = await start(events_per_hour=20)
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    space_id = (await space_of(memgate, owner))["id"]
    session = (await new_session(memgate, owner, space_id)).json()["id"]
    path = f"/memory/{space_id}/sessions/{session}/events"
    assert (await call(memgate, "POST", path, owner, events(15))).status_code == 200
    too_many = await call(memgate, "POST", path, owner, events(6))  # all or none
    error = refused(too_many, 429, "MEMORY_SPACE_RATE_LIMITED")
    assert error["details"]["limit"] == "eventsPerHour"
    assert error["details"]["max"] == 20
    assert 0 < int(too_many.headers["Retry-After"]) <= 3600
    assert (await call(memgate, "POST", path, owner, events(4))).status_code == 200
    edited = await call(memgate, "PATCH", f"{path}/0", owner, {"body": {"content": "edited"}})
    assert edited.status_code == 200, edited.text  # an edit is one of the hour's (a rewrite)
    refused(await call(memgate, "PATCH", f"{path}/1", owner, {"body": {"content": "again"}}),
            429, "MEMORY_SPACE_RATE_LIMITED")
    listed = await call(memgate, "GET", f"{path}?lastN=200", owner)
    assert len(listed.json()["events"]) == 19


async def test_a_space_with_thirteen_thousand_entities_still_answers_its_reads(
        memgate: Memgate) -> None:
    """Past ~12,000 entities with long ids the whole entity map no longer fits one bus reply:
    reads ask only for the entities they show, and filters are resolved where the map is."""
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    space_id = (await space_of(memgate, owner))["id"]
    memory_id = await added(memgate, owner, space_id, "the first user's note", "user-0")
    bus = BusClient(await memgate.internal("space-memories"))

    async def seed(i: int) -> None:  # what 13,000 accepted adds about as many entities leave
        entity = Entity(user_id=f"{i:06d}".ljust(200, "u"), agent_id=f"{i:06d}".ljust(200, "a"),
                        run_id=f"{i:06d}".ljust(200, "r"))
        await bus.request(subjects.spaces_internal("entity"),
                          EntityRequest(space_id=space_id, entity=entity), Entity)
        await bus.request(subjects.spaces_internal("settle"),
                          EntitySettled(space_id=space_id, entity=entity, stored=True), Done)

    for start in range(0, 13_000, 500):
        await asyncio.gather(*(seed(i) for i in range(start, start + 500)))

    assert await stored(memgate, owner, space_id) == ["the first user's note"]
    got = await call(memgate, "GET", f"/memory/{space_id}/v1/memories/{memory_id}/", owner)
    assert got.status_code == 200, got.text
    assert got.json()["user_id"] == "user-0"
    found = await call(memgate, "POST", f"/memory/{space_id}/v3/memories/", owner,
                       {"filters": {"user_id": "user-0"}})
    assert [m["memory"] for m in found.json()["results"]] == ["the first user's note"]
    searched = await call(memgate, "POST", f"/memory/{space_id}/v3/memories/search/", owner,
                          {"query": "note", "filters": {"user_id": "*"}})
    assert searched.status_code == 200, searched.text
    assert [m["user_id"] for m in searched.json()["results"]] == ["user-0"]

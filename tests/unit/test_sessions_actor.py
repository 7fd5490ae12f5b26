"""The sessions actor on the in-memory broker, with a real DuckDB file and a clock the test
moves: extract_memories (success, failure and backoff, nothing half-done), the 409 on a type
that ran, and `never` after the operator turned it off. The spaces actor's access answer and
the space-memories actor are faked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memgate.actors.sessions import SessionsActor
from memgate.bus import subjects
from memgate.contracts import Contract, ErrorCode
from memgate.contracts.erasure import SubjectCount, SubjectTarget
from memgate.contracts.errors import MemgateError, UnavailableError
from memgate.contracts.sessions import (
    EventList, EventView, Extracted, ExtractRequest, SessionView,
)
from memgate.contracts.spaces import AccessRequest, SpaceAccess, SpaceRole
from memgate.policy.lifecycle import Rules
from memgate.storage.directory import hash_token
from tests.fakes import FakeRequester, Served, served

pytestmark = pytest.mark.unit

TOKEN = "member-token"
SPACE = "sp_1"
PARTICIPANT = "67500a000000000000000001"
DEFAULT = Rules()


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Extractor:
    """The space-memories actor: fails while `failing`, records what it was asked."""

    failing: bool = False
    asked: list[ExtractRequest] = field(default_factory=list)

    async def __call__(self, payload: bytes) -> Contract:
        request = ExtractRequest.model_validate_json(payload)
        self.asked.append(request)
        if self.failing:
            raise UnavailableError("the LLM did not answer")
        return Extracted(memory_ids=[f"m{e.sequence_id}" for e in request.events])


@dataclass
class World:
    bus: Served
    clock: Clock
    extractor: Extractor
    actor: SessionsActor
    role: list[SpaceRole]

    async def command(self, operation: str, body: dict[str, Any], result: type[Any],
                      **params: str) -> Any:
        return await self.bus.command(subjects.space(f"sessions.{operation}"), TOKEN, body,
                                      result, spaceId=SPACE, **params)

    async def session(self, *strategies: dict[str, Any]) -> SessionView:
        body: dict[str, Any] = {"participants": [PARTICIPANT]}
        if strategies:
            body["lifecycleStrategies"] = list(strategies)
        created: SessionView = await self.command("create", body, SessionView)
        return created

    async def post(self, session: SessionView, *texts: str) -> EventList:
        events = [{"body": {"content": text}, "emitter": {"type": "user", "id": PARTICIPANT},
                   "eventType": "message"} for text in texts]
        posted: EventList = await self.command("events.append", {"events": events}, EventList,
                                               sessionId=session.id)
        return posted


def access(role: list[SpaceRole], llm: bool = True) -> Any:
    async def answer(payload: bytes) -> Contract:
        request = AccessRequest.model_validate_json(payload)
        assert request.token_hash == hash_token(TOKEN)
        return SpaceAccess(space_id=request.space_id, workspace_id="ws", member_id="mb",
                           role=role[0], permissions=role[0].permissions,
                           llm_model_name="gpt-4o-mini" if llm else None,
                           llm_base_url="http://127.0.0.1:1/v1" if llm else None)

    return answer


@asynccontextmanager
async def world_at(path: Path, rules: Rules = DEFAULT, clock: Clock | None = None
                   ) -> AsyncIterator[World]:
    clock = clock or Clock()
    extractor, role = Extractor(), [SpaceRole.OWNER]
    bus = FakeRequester({subjects.spaces_internal("access"): access(role),
                         subjects.space_memories_internal("extract"): extractor})
    actor = SessionsActor(path=path, bus=bus, rules=rules, now=clock, interval_s=None,
                          retry_s=30, retry_max_s=600)
    async with served(actor) as bus_served:
        yield World(bus_served, clock, extractor, actor, role)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with world_at(tmp_path / "sessions.duckdb") as built:
        yield built


def extract(**trigger: Any) -> dict[str, Any]:
    return {"type": "extract_memories", "trigger": trigger}


def soft_delete(**trigger: Any) -> dict[str, Any]:
    return {"type": "soft_delete", "trigger": trigger}


async def test_extraction_sends_the_masked_events_and_runs_once(world: World) -> None:
    session = await world.session(extract(idle=600), soft_delete(ttl=86400))
    await world.post(session, "I deploy on Fridays", "mail me at alice@example.com")
    world.clock.advance(600)
    assert await world.actor.run_due() == [(session.id, "extract_memories")]
    [request] = world.extractor.asked
    assert (request.space_id, request.workspace_id, request.session_id) == (SPACE, "ws",
                                                                             session.id)
    assert request.participants == [PARTICIPANT]
    assert [(e.sequence_id, e.text) for e in request.events] == [
        (0, "user: I deploy on Fridays"), (1, "user: mail me at [EMAIL]")]
    seen = await world.command("get", {}, SessionView, sessionId=session.id)
    assert [run.type for run in seen.lifecycle_runs] == ["extract_memories"]
    world.clock.advance(3600)
    assert await world.actor.run_due() == []
    assert len(world.extractor.asked) == 1


async def test_a_failed_extraction_is_retried_with_backoff_and_marked_only_on_success(
        world: World) -> None:
    session = await world.session(extract(ttl=60))
    await world.post(session, "hello")
    world.extractor.failing = True
    world.clock.advance(60)
    assert await world.actor.run_due() == []
    seen = await world.command("get", {}, SessionView, sessionId=session.id)
    assert seen.lifecycle_runs == []  # nothing half-done
    waits = []
    for _ in range(4):  # 30 s, 60 s, 120 s, 240 s
        asked = len(world.extractor.asked)
        world.clock.advance(1)
        await world.actor.run_due()
        assert len(world.extractor.asked) == asked  # not before its time
        waited = 1
        while len(world.extractor.asked) == asked:
            world.clock.advance(1)
            waited += 1
            await world.actor.run_due()
        waits.append(waited)
    assert waits == [30, 60, 120, 240]
    world.extractor.failing = False
    world.clock.advance(480)
    assert await world.actor.run_due() == [(session.id, "extract_memories")]
    seen = await world.command("get", {}, SessionView, sessionId=session.id)
    assert [run.type for run in seen.lifecycle_runs] == ["extract_memories"]


async def test_soft_delete_does_not_wait_for_a_failing_extraction_that_then_still_runs(
        world: World) -> None:
    session = await world.session(extract(ttl=60), soft_delete(ttl=60))
    await world.post(session, "hello")
    world.extractor.failing = True
    world.clock.advance(60)
    assert await world.actor.run_due() == [(session.id, "soft_delete")]
    with pytest.raises(MemgateError) as gone:
        await world.command("get", {}, SessionView, sessionId=session.id)
    assert gone.value.code is ErrorCode.NOT_FOUND
    world.extractor.failing = False
    world.clock.advance(30)
    assert await world.actor.run_due() == [(session.id, "extract_memories")]
    assert [e.text for e in world.extractor.asked[-1].events] == ["user: hello"]


async def test_a_type_that_ran_cannot_be_reconfigured_but_is_accepted_unchanged(
        world: World) -> None:
    session = await world.session(extract(idle=600))
    await world.post(session, "hello")
    world.clock.advance(600)
    assert await world.actor.run_due() == [(session.id, "extract_memories")]
    with pytest.raises(MemgateError) as refused:
        await world.command("patch", {"lifecycleStrategies": [extract(idle=60)]}, SessionView,
                            sessionId=session.id)
    assert refused.value.code is ErrorCode.CONFLICT
    assert refused.value.details["type"] == "extract_memories"
    seen = await world.command("get", {}, SessionView, sessionId=session.id)
    updated = await world.command(
        "patch", {"lifecycleStrategies": [s.model_dump(mode="json", by_alias=True)
                                          for s in seen.lifecycle_strategies],
                  "description": "renamed"}, SessionView, sessionId=session.id,
        ifMatch=str(seen.version))
    assert (updated.version, updated.description) == (seen.version + 1, "renamed")


async def test_never_may_be_re_sent_after_the_operator_turned_it_off(tmp_path: Path) -> None:
    path, clock = tmp_path / "sessions.duckdb", Clock()
    async with world_at(path, Rules(never_enabled=True), clock) as world:
        session = await world.session(soft_delete(never=True))
        other = await world.session(soft_delete(ttl=60))
    async with world_at(path, Rules(never_enabled=False), clock) as world:
        kept = await world.command("patch", {"lifecycleStrategies": [soft_delete(never=True)]},
                                   SessionView, sessionId=session.id)
        assert kept.version == 2
        with pytest.raises(MemgateError) as refused:
            await world.command("patch", {"lifecycleStrategies": [soft_delete(never=True)]},
                                SessionView, sessionId=other.id)
        assert refused.value.code is ErrorCode.UNPROCESSABLE


async def test_sessions_and_events_survive_a_restart(tmp_path: Path) -> None:
    path, clock = tmp_path / "sessions.duckdb", Clock()
    async with world_at(path, clock=clock) as world:
        session = await world.session(extract(idle=60))
        await world.post(session, "one", "two")
        clock.advance(60)
        await world.actor.run_due()
    async with world_at(path, clock=clock) as world:
        seen = await world.command("get", {}, SessionView, sessionId=session.id)
        assert seen.event_count == 2 and [r.type for r in seen.lifecycle_runs] == [
            "extract_memories"]
        third = await world.command("events.append", {
            "body": "three", "emitter": {"type": "user", "id": PARTICIPANT},
            "eventType": "message"}, EventView, sessionId=session.id)
        assert third.sequence_id == 2


async def test_a_consumer_is_refused_writes_and_nobody_without_view_sees_anything(
        world: World) -> None:
    session = await world.session()
    world.role[0] = SpaceRole.CONSUMER
    with pytest.raises(MemgateError) as refused:
        await world.post(session, "hi")
    assert refused.value.code is ErrorCode.FORBIDDEN
    assert (await world.command("get", {}, SessionView, sessionId=session.id)).id == session.id


async def test_erasure_finds_and_deletes_the_sessions_of_a_participant(world: World) -> None:
    other = "67500a0000000000000000ff"
    theirs = await world.session()
    await world.post(theirs, "one", "two")
    mine: SessionView = await world.command(
        "create", {"participants": [other]}, SessionView)
    await world.post(mine, "kept")
    ask = subjects.sessions_internal("subject")
    found = await world.bus.call(ask, SubjectTarget(tenant="ws", external_id=PARTICIPANT.upper()),
                                 SubjectCount)
    assert found.record_ids == [theirs.id, f"{theirs.id}/0", f"{theirs.id}/1"]
    elsewhere = await world.bus.call(ask, SubjectTarget(tenant="other", external_id=PARTICIPANT),
                                     SubjectCount)
    assert elsewhere.count == 0
    erased = await world.bus.call(ask, SubjectTarget(tenant="ws", external_id=PARTICIPANT,
                                                     erase=True), SubjectCount)
    assert erased.count == 3
    with pytest.raises(MemgateError) as gone:
        await world.command("get", {}, SessionView, sessionId=theirs.id)
    assert gone.value.code is ErrorCode.NOT_FOUND
    assert (await world.bus.call(ask, SubjectTarget(tenant="ws", external_id=PARTICIPANT),
                                 SubjectCount)).count == 0
    assert (await world.command("get", {}, SessionView, sessionId=mine.id)).event_count == 1

"""Bulk import of agent memories (issue 45) and idempotency keys on remember (issue 47), over
REST and over the bus, on a real nats-server and real DuckDB files."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio

from memgate.contracts.errors import (
    RateLimitedError, UnauthenticatedError, ValidationFailedError,
)
from memgate.contracts.memory import ImportResult
from tests.agents import Agent
from tests.conftest import ADMIN_TOKEN, Memgate, run_memgate

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def memgate(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Memgate]:
    """One memgate for the module: each test works in workspaces of its own. The import budget
    is a thousand memories an hour per credential. No embedder: these tests read what storage
    answers, and embedding the module's thousands of memories on a loaded machine held its stop
    for minutes (recall after an import: `tests/test_bulk_import_recall.py`)."""
    async with AsyncExitStack() as stack:
        yield await run_memgate(tmp_path_factory.mktemp("import"), stack,
                                skip=frozenset({"embedder.p0"}), limit_imports_per_hour=BUDGET)


BUDGET = 1000
PERSONAL = "Mail jane.doe@example.com about the tea order"


def items(count: int, *, keys: str | None = None, namespace: str = "imported") -> list[Any]:
    return [{"namespace": namespace, "text": f"imported fact number {i} about green tea",
             **({"idempotencyKey": f"{keys}-{i}"} if keys else {})} for i in range(count)]


async def listed(agent: Agent, namespace: str) -> list[str]:
    """Every current memory of the namespace, page by page: their texts."""
    texts: list[str] = []
    cursor = None
    while True:
        page = await agent.list(namespace=namespace, limit=100, cursor=cursor)
        texts += [m.text for m in page.memories]
        if (cursor := page.next_cursor) is None:
            return texts


async def test_a_thousand_memories_imported_at_once_are_acknowledged_and_listed(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport)
    result = await agent.import_memories(items(1000))
    assert [m.index for m in result.stored] == list(range(1000))
    assert result.refused == []
    assert len({m.memory_id for m in result.stored}) == 1000
    assert sorted(await listed(agent, "imported")) == sorted(
        f"imported fact number {i} about green tea" for i in range(1000))
    remembered = await agent.remember("own", "a remember after an import is not rate limited")
    assert remembered.memory_id


async def test_a_bad_item_is_refused_alone_with_its_index_code_and_message(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport)
    batch: list[Any] = [
        {"namespace": "ok", "text": "a good one"},
        {"namespace": "ok", "text": "t" * 1001},  # over the remember's size limit
        "not an object",
        {"namespace": "jane.doe@example.com", "text": "personal data in a name"},
        {"namespace": "ok", "text": " jane.doe@example.com "},  # nothing left once masked
        {"namespace": "ok", "text": PERSONAL},
        {"namespace": "ok", "text": "an unknown field", "memberId": "someone"},
        {"namespace": "ok", "text": "a good one too", "key": "k"},
    ]
    result = await agent.import_memories(batch)
    assert [(r.index, r.error.code) for r in result.refused] == [
        (1, "VALIDATION_ERROR"), (2, "VALIDATION_ERROR"), (3, "AGENT_MEMORY_PERSONAL_DATA"),
        (4, "AGENT_MEMORY_EMPTY"), (6, "VALIDATION_ERROR")]
    assert all(r.error.message for r in result.refused)
    assert "jane" not in json.dumps(result.model_dump(mode="json"))
    assert [m.index for m in result.stored] == [0, 5, 7]
    assert result.stored[1].masked == {"EMAIL": 1}
    assert sorted(await listed(agent, "ok")) == sorted(
        ["a good one", "Mail [EMAIL] about the tea order", "a good one too"])


async def test_more_than_a_thousand_items_are_refused_whole_in_the_error_shape(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport)
    with pytest.raises(ValidationFailedError):  # the REST agent checks the §3.10 shape
        await agent.import_memories(items(1001))
    assert await listed(agent, "imported") == []


@pytest.mark.parametrize("body", [
    None, [], {}, {"items": []}, {"items": "x"}, {"items": [{}]}, {"items": [[1, [2, [3]]]]},
    {"items": [{"namespace": "n", "text": "t"}], "extra": 1}, {"items": [None] * 1000},
    {"items": [{"namespace": "n", "text": "\ud800"}]},
])
async def test_hostile_import_bodies_get_a_4xx_never_a_500(memgate: Memgate,
                                                            body: Any) -> None:
    owner = await memgate.workspace()
    token = await memgate.credential(owner)
    response = await memgate.http.post(
        "/api/agent/v1/memories/import", content=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert set(response.json()["error"]) == {"code", "message", "details"}
    else:  # every item refused alone
        assert ImportResult.model_validate(response.json()).stored == []


async def test_an_import_without_credential_or_in_broken_json_is_refused(
    memgate: Memgate
) -> None:
    unauthenticated = await memgate.http.post("/api/agent/v1/memories/import",
                                              json={"items": items(2)})
    broken = await memgate.http.post(
        "/api/agent/v1/memories/import", content=b'{"items": [',
        headers={"Authorization": "Bearer nope", "Content-Type": "application/json"})
    oversized = await memgate.http.post(
        "/api/agent/v1/memories/import", content=b"x" * (5 * 1024 * 1024),
        headers={"Authorization": "Bearer nope", "Content-Type": "application/json"})
    assert unauthenticated.status_code == 401
    assert broken.status_code in (400, 401)
    assert oversized.status_code == 413
    for response in (unauthenticated, broken, oversized):
        assert set(response.json()["error"]) == {"code", "message", "details"}


async def test_the_same_batch_imported_twice_is_stored_once_with_the_same_answers(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport)
    batch = items(50, keys="batch")
    batch.append({**batch[0], "text": "the first key given twice in one batch"})
    batch.append({"namespace": "imported", "text": PERSONAL, "idempotencyKey": "masked"})
    first = await agent.import_memories(batch)
    again = await agent.import_memories(batch)
    assert again == first
    assert first.stored[50].memory_id == first.stored[0].memory_id
    assert first.stored[51].masked == {"EMAIL": 1}
    assert len(await listed(agent, "imported")) == 51


async def test_a_remember_retried_with_its_key_is_stored_once(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport)
    first = await agent.remember("retried", PERSONAL, idempotency_key="remember-1")
    again = await agent.remember("retried", PERSONAL, idempotency_key="remember-1")
    other = await agent.remember("retried", PERSONAL, idempotency_key="remember-2")
    assert again == first
    assert other.memory_id != first.memory_id
    assert len(await listed(agent, "retried")) == 2
    imported = await agent.import_memories([{"namespace": "retried", "text": "x",
                                             "idempotencyKey": "remember-1"}])
    assert imported.stored[0].memory_id == first.memory_id  # one mechanism for both


async def test_the_idempotency_key_header_of_a_rest_remember(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    headers = {"Authorization": f"Bearer {await memgate.credential(owner)}",
               "Idempotency-Key": "header-key"}
    body = {"namespace": "n", "text": "sent twice"}
    first = await memgate.http.post("/api/agent/v1/memories/remember", json=body,
                                    headers=headers)
    again = await memgate.http.post("/api/agent/v1/memories/remember", json=body,
                                    headers=headers)
    too_long = await memgate.http.post("/api/agent/v1/memories/remember", json=body,
                                       headers={**headers, "Idempotency-Key": "k" * 256})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert too_long.status_code == 400
    assert set(too_long.json()["error"]) == {"code", "message", "details"}


async def test_another_members_same_key_does_not_collide(memgate: Memgate,
                                                         transport: str) -> None:
    owner = await memgate.workspace()
    editor = await memgate.member(owner)
    first = await memgate.agent(transport, await memgate.credential(owner))
    second = await memgate.agent(transport, await memgate.credential(editor))
    elsewhere = await memgate.new_agent(transport)
    batch = items(3, keys="shared")
    answers = [await agent.import_memories(batch) for agent in (first, second, elsewhere)]
    ids = [{m.memory_id for m in answer.stored} for answer in answers]
    assert all(len(i) == 3 for i in ids)
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    for agent in (first, second, elsewhere):
        assert len(await listed(agent, "imported")) == 3


async def test_the_operator_import_keeps_created_at_and_owner(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    editor = await memgate.member(owner)
    viewer = await memgate.member(owner, "viewer")
    then = "2024-03-01T12:00:00Z"
    response = await memgate.admin(
        "POST", f"/api/admin/workspaces/{owner.workspace_id}/memories/import", ADMIN_TOKEN,
        {"items": [
            {"namespace": "old", "text": "kept from mem0", "memberId": editor.member_id,
             "createdAt": then},
            {"namespace": "old", "text": "now", "memberId": owner.member_id},
            {"namespace": "old", "text": "nobody", "memberId": "no-such-member"},
            {"namespace": "old", "text": "may not write", "memberId": viewer.member_id},
            {"namespace": "old", "text": "later", "memberId": editor.member_id,
             "createdAt": "2999-01-01T00:00:00Z"},
            {"namespace": "old", "text": "no owner"},
        ]})
    assert response.status_code == 200, response.text
    result = ImportResult.model_validate(response.json())
    assert [m.index for m in result.stored] == [0, 1]
    assert result.stored[0].created_at == datetime(2024, 3, 1, 12, tzinfo=UTC)
    assert [(r.index, r.error.code) for r in result.refused] == [
        (2, "NOT_FOUND"), (3, "INSUFFICIENT_SCOPE"), (4, "VALIDATION_ERROR"),
        (5, "VALIDATION_ERROR")]
    editors = await memgate.agent("rest", await memgate.credential(editor))
    [memory] = (await editors.list(namespace="old")).memories
    assert (memory.text, memory.created_at) == ("kept from mem0", result.stored[0].created_at)
    owners = await memgate.agent("rest", await memgate.credential(owner))
    assert [m.text for m in (await owners.list(namespace="old")).memories] == ["now"]


async def test_only_the_operator_may_use_the_operator_import(memgate: Memgate,
                                                             transport: str) -> None:
    agent = await memgate.new_agent(transport)
    owner = await memgate.workspace()
    as_agent = await memgate.admin(
        "POST", f"/api/admin/workspaces/{owner.workspace_id}/memories/import",
        await memgate.credential(owner),
        {"items": [{"namespace": "n", "text": "t", "memberId": owner.member_id}]})
    as_member = await memgate.admin(
        "POST", f"/api/admin/workspaces/{owner.workspace_id}/memories/import", owner.token,
        {"items": [{"namespace": "n", "text": "t", "memberId": owner.member_id}]})
    assert as_agent.status_code == 403, as_agent.text
    assert as_member.status_code == 401, as_member.text
    refused = await agent.import_memories([{"namespace": "n", "text": "t",
                                            "memberId": owner.member_id}])
    assert [r.error.code for r in refused.refused] == ["VALIDATION_ERROR"]


async def test_the_import_budget_refuses_with_429_once_spent(memgate: Memgate,
                                                             transport: str) -> None:
    agent = await memgate.new_agent(transport)
    first = await agent.import_memories(items(600))
    second = await agent.import_memories(items(600, namespace="second"))
    with pytest.raises(RateLimitedError) as spent:
        await agent.import_memories(items(1))
    await agent.remember("own", "the remembers keep their own rate")
    assert len(first.stored) == 600
    assert [m.index for m in second.stored] == list(range(BUDGET - 600))
    assert [(r.index, r.error.code) for r in second.refused] == [
        (i, "AGENT_MEMORY_RATE_LIMITED") for i in range(BUDGET - 600, 600)]
    assert spent.value.details["limit"] == "importsPerHour"
    assert 1 <= spent.value.details["retryAfterSeconds"] <= 3600
    elsewhere = await memgate.new_agent(transport)
    assert len((await elsewhere.import_memories(items(1))).stored) == 1  # its own budget
    nobody = await memgate.agent(transport, "nope")
    with pytest.raises(UnauthenticatedError):
        await nobody.import_memories(items(1))


"""Governance on the in-memory broker: authentication first, then workspace, scope and role
rules; masking; and only masked text ever forwarded to storage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from memgate.actors.governance import GovernanceActor
from memgate.bus import subjects
from memgate.contracts import (
    ErrorCode, ForgetResult, ListResult, Memory, Principal, RecallResult, RememberResult, Role,
    Scope, WorkspaceSettings,
)
from memgate.contracts.errors import MemgateError
from memgate.contracts.internal import RecallQuery
from memgate.contracts.registry import Citation, Verification
from memgate.contracts.registry import Scope as ContextScope
from memgate.storage.directory import hash_token
from memgate.ports.services import BusRecall
from tests.fakes import (
    FakeDirectory, FakeRegistry, FakeRequester, FakeStorage, Served, served,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, tzinfo=UTC)

TOKEN = "agent-token"
EMAIL = "ada@example.com"


def principal(*, role: Role = Role.EDITOR, scopes: frozenset[Scope] = frozenset(Scope),
              enabled: bool = True, non_retaining: bool = False,
              context_set_id: str | None = None) -> Principal:
    return Principal(workspace_id="ws", member_id="member", credential_id="cred", role=role,
                     scopes=scopes, context_set_id=context_set_id,
                     settings=WorkspaceSettings(agent_memories_enabled=enabled,
                                                non_retaining=non_retaining))


@dataclass
class World:
    bus: Served
    directory: FakeDirectory
    registry: FakeRegistry
    storage: FakeStorage
    recall: FakeRequester

    def holds(self, who: Principal) -> None:
        self.directory.principals[hash_token(TOKEN)] = who

    async def remember(self, body: dict[str, Any], token: str | None = TOKEN) -> RememberResult:
        return await self.bus.command(subjects.REMEMBER, token, body, RememberResult)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    directory, registry, storage = FakeDirectory(), FakeRegistry(), FakeStorage()
    recall = FakeRequester()
    actor = GovernanceActor(directory=directory, registry=registry, storage=storage,
                            recall=BusRecall(recall))
    async with served(actor) as bus:
        yield World(bus, directory, registry, storage, recall)


async def code_of(call: object) -> ErrorCode:
    with pytest.raises(MemgateError) as caught:
        await call  # type: ignore[misc]
    return caught.value.code


async def test_a_command_without_a_token_is_unauthenticated_before_its_body_is_read(
        world: World) -> None:
    assert await code_of(world.remember({"bad": "body"}, token=None)) == \
        ErrorCode.UNAUTHENTICATED
    assert world.directory.asked == 0


async def test_an_unknown_token_is_unauthenticated_even_with_an_invalid_body(
        world: World) -> None:
    assert await code_of(world.remember({"bad": "body"})) == ErrorCode.UNAUTHENTICATED


async def test_a_valid_credential_with_an_invalid_body_is_a_validation_error(
        world: World) -> None:
    world.holds(principal())
    assert await code_of(world.remember({"bad": "body"})) == ErrorCode.VALIDATION_ERROR


@pytest.mark.parametrize(("who", "code"), [
    # workspace settings come first: the member cannot fix them with another credential
    (principal(non_retaining=True, enabled=False, scopes=frozenset()),
     ErrorCode.NON_RETAINING_WORKSPACE),
    (principal(enabled=False, scopes=frozenset()), ErrorCode.AGENT_MEMORY_DISABLED),
    (principal(scopes=frozenset({Scope.READ})), ErrorCode.INSUFFICIENT_SCOPE),
    (principal(role=Role.VIEWER), ErrorCode.INSUFFICIENT_SCOPE),
])
async def test_remember_refuses_in_the_order_a_caller_can_fix(world: World, who: Principal,
                                                              code: ErrorCode) -> None:
    world.holds(who)
    assert await code_of(world.remember({"namespace": "n", "text": "hello"})) == code
    assert world.storage.remembered == []


async def test_a_viewer_may_list_but_not_forget(world: World) -> None:
    world.holds(principal(role=Role.VIEWER))
    listed = await world.bus.command(subjects.LIST, TOKEN, {}, ListResult)
    assert listed.memories == []
    forget = world.bus.command(subjects.FORGET, TOKEN, {"key": "k"}, ForgetResult)
    assert await code_of(forget) == ErrorCode.INSUFFICIENT_SCOPE
    assert world.storage.forgotten == []


async def test_storage_receives_only_the_masked_text_and_the_counts(world: World) -> None:
    world.holds(principal())
    result = await world.remember({"namespace": "n", "text": f"write to {EMAIL} on Monday"})
    assert result.masked == {"EMAIL": 1}
    [stored] = world.storage.remembered
    assert stored.text == "write to [EMAIL] on Monday"
    assert EMAIL not in stored.to_json().decode()
    assert (stored.owner.tenant, stored.owner.subject_id) == ("ws", "member")
    assert stored.credential_id == "cred"


@pytest.mark.parametrize("field", ["key", "namespace"])
async def test_personal_data_in_a_name_is_refused_not_masked(world: World, field: str) -> None:
    world.holds(principal())
    body = {"namespace": "n", "text": "hello", field: EMAIL}
    assert await code_of(world.remember(body)) == ErrorCode.AGENT_MEMORY_PERSONAL_DATA
    assert world.storage.remembered == []


async def test_text_that_is_only_personal_data_is_empty_after_masking(world: World) -> None:
    world.holds(principal())
    assert await code_of(world.remember({"namespace": "n", "text": f" {EMAIL} "})) == \
        ErrorCode.AGENT_MEMORY_EMPTY
    assert world.storage.remembered == []


async def test_recall_forwards_the_masked_query(world: World) -> None:
    world.holds(principal(role=Role.VIEWER))
    seen: list[RecallQuery] = []

    async def recall(payload: bytes) -> RecallResult:
        seen.append(RecallQuery.model_validate_json(payload))
        return RecallResult(memories=[])

    world.recall.routes[subjects.recall_internal()] = recall
    await world.bus.command(subjects.RECALL, TOKEN, {"query": f"mail {EMAIL}"}, RecallResult)
    assert [q.query for q in seen] == ["mail [EMAIL]"]


async def test_a_bound_credential_cannot_name_a_collection_outside_its_set(world: World) -> None:
    world.holds(principal(context_set_id="cs"))
    world.registry.scopes["cs"] = ContextScope(collection_ids=["inside"], document_ids=[])
    listed = world.bus.command(subjects.LIST, TOKEN, {"collectionId": "outside"}, ListResult)
    assert await code_of(listed) == ErrorCode.AGENT_CONTEXT_SET_SCOPE_REFUSED
    await world.bus.command(subjects.LIST, TOKEN, {"collectionId": "inside"}, ListResult)
    assert world.storage.queries[-1].collection_ids == ["inside"]


async def test_list_hides_memories_whose_sources_are_gone_and_marks_changed_ones(
        world: World) -> None:
    world.holds(principal())
    citation = Citation(passage_id="p", document_id="d", version=1, sha256="0" * 64)
    memories = [Memory(memory_id=i, namespace="n", text=i, created_at=NOW,
                       citations=[citation] if i != "plain" else [])
                for i in ("gone", "changed", "plain")]
    world.storage.page = ListResult(memories=memories)
    world.registry.verdict = Verification(hidden=["gone"], changed=["changed"])
    listed = await world.bus.command(subjects.LIST, TOKEN, {}, ListResult)
    assert [(m.memory_id, m.source_state) for m in listed.memories] == \
        [("changed", "changed"), ("plain", "current")]
    assert listed.hidden == 1
    assert set(world.registry.verified[-1]) == {"gone", "changed"}  # only what cites something

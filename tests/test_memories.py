"""SPEC §3.1–§3.4, §3.10 stories, each over REST and over the bus, on a real nats-server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import nats
import pytest

from memgate.bus import BusClient, subjects
from memgate.contracts import RememberResult
from memgate.contracts.errors import (
    AgentMemoryDisabledError,
    AgentMemoryEmptyError,
    AgentMemoryPersonalDataError,
    InsufficientScopeError,
    NonRetainingWorkspaceError,
    NotFoundError,
    UnauthenticatedError,
    ValidationFailedError,
)
from tests.conftest import Memgate

PERSONAL = (
    "Mail jane.doe@example.com or call +1 415 555 0100, card 4111 1111 1111 1111, "
    "IBAN GB82 WEST 1234 5698 7654 32, id 123456782"
)


async def test_remember_masks_personal_data_and_says_what_it_masked(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport, "editor")
    first = await agent.remember("contacts", PERSONAL)
    again = await agent.remember("contacts", PERSONAL)
    listed = await agent.list()
    assert first.masked == {"EMAIL": 1, "PHONE": 1, "CARD": 1, "BANK_ACCOUNT": 1, "IL_ID": 1}
    texts = [m.text for m in listed.memories]
    assert texts == [texts[0], texts[0]], "the same input always gives the same output"
    assert texts[0] == (
        "Mail [EMAIL] or call [PHONE], card [CARD], IBAN [BANK_ACCOUNT], id [IL_ID]"
    )
    assert again.memory_id != first.memory_id
    for memory in listed.memories:
        assert (memory.type, memory.evidence, memory.trust) == ("memory", False, "untrusted")
    await agent.close()


async def test_personal_data_in_namespace_or_key_is_refused(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport, "editor")
    with pytest.raises(AgentMemoryPersonalDataError) as by_namespace:
        await agent.remember("jane.doe@example.com", "likes tea")
    with pytest.raises(AgentMemoryPersonalDataError) as by_key:
        await agent.remember("people", "likes tea", key="+1 415 555 0100")
    assert by_namespace.value.details == {"field": "namespace"}
    assert by_key.value.details == {"field": "key"}
    assert (await agent.list()).memories == []
    await agent.close()


async def test_text_that_is_only_personal_data_is_refused_as_empty(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport, "editor")
    with pytest.raises(AgentMemoryEmptyError):
        await agent.remember("contacts", " jane.doe@example.com  4111 1111 1111 1111 ")
    await agent.close()


@pytest.mark.parametrize(
    "body",
    [
        {"namespace": "n" * 65, "text": "ok"},
        {"namespace": "", "text": "ok"},
        {"namespace": "ok", "text": "t" * 1001},
        {"namespace": "ok", "text": "ok", "key": "k" * 121},
    ],
)
async def test_lengths_of_spec_3_2_are_enforced(
    memgate: Memgate, transport: str, body: dict[str, str]
) -> None:
    owner = await memgate.workspace()
    token = await memgate.credential(owner)
    if transport == "rest":
        response = await memgate.http.post(
            "/api/agent/v1/memories/remember",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "VALIDATION_ERROR"
    else:
        credential = await memgate.nats_agent()
        nc = await nats.connect(
            memgate.nats_url,
            nkeys_seed_str=credential["seed"],
            inbox_prefix=credential["inboxPrefix"],
        )
        with pytest.raises(ValidationFailedError) as failure:
            await BusClient(nc).command(subjects.REMEMBER, token, body, RememberResult)
        assert failure.value.details["problems"]
        await nc.close()


async def test_same_key_supersedes_and_list_shows_current_versions_newest_first(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport, "editor")
    first = await agent.remember("prefs", "deploys on Fridays", key="deploy-day")
    await agent.remember("prefs", "likes green tea")
    second = await agent.remember("prefs", "deploys on Thursdays", key="deploy-day")
    listed = await agent.list()
    assert (first.superseded, second.superseded) == (0, 1)
    assert [m.text for m in listed.memories] == ["deploys on Thursdays", "likes green tea"]
    assert [m.text for m in (await agent.list(key="deploy-day")).memories] == [
        "deploys on Thursdays"
    ]
    await agent.close()


async def test_list_as_of_shows_what_was_current_then(memgate: Memgate, transport: str) -> None:
    agent = await memgate.new_agent(transport, "editor")
    await agent.remember("prefs", "deploys on Fridays", key="deploy-day")
    between = datetime.now(UTC)
    await asyncio.sleep(0.01)
    await agent.remember("prefs", "deploys on Thursdays", key="deploy-day")
    then = await agent.list(as_of=between)
    assert [m.text for m in then.memories] == ["deploys on Fridays"]
    assert then.memories[0].superseded_at is not None
    before_anything = await agent.list(as_of=datetime(2000, 1, 1, tzinfo=UTC))
    assert before_anything.memories == []
    await agent.close()


async def test_list_pages_with_an_opaque_cursor_stable_under_new_writes(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport, "editor")
    for i in range(5):
        await agent.remember("notes", f"note number {i}")
    page1 = await agent.list(limit=2)
    await agent.remember("notes", "written while paging")
    page2 = await agent.list(limit=2, cursor=page1.next_cursor)
    page3 = await agent.list(limit=2, cursor=page2.next_cursor)
    seen = [m.text for p in (page1, page2, page3) for m in p.memories]
    assert seen == [f"note number {i}" for i in (4, 3, 2, 1, 0)]
    assert page3.next_cursor is None
    with pytest.raises(ValidationFailedError):
        await agent.list(cursor="not-a-cursor")
    await agent.close()


async def test_forget_by_key_deletes_every_version_and_by_id_one(
    memgate: Memgate, transport: str
) -> None:
    agent = await memgate.new_agent(transport, "editor")
    await agent.remember("prefs", "v1", key="k")
    await agent.remember("prefs", "v2", key="k")
    keep = await agent.remember("prefs", "keep me")
    drop = await agent.remember("prefs", "drop me")
    assert (await agent.forget(namespace="prefs", key="k")).deleted == 2
    assert (await agent.forget(memory_id=drop.memory_id)).deleted == 1
    assert [m.memory_id for m in (await agent.list()).memories] == [keep.memory_id]
    assert (await agent.list(as_of=keep.created_at)).memories[0].memory_id == keep.memory_id
    with pytest.raises(NotFoundError):
        await agent.forget(memory_id=drop.memory_id)
    await agent.close()


async def test_a_forget_retried_under_its_idempotency_key_gets_its_first_answer(
        memgate: Memgate, transport: str) -> None:
    """A forget whose answer was lost (a timeout) and is sent again gets what it answered,
    not a 404 for the memory it deleted; another key, or another member's same key, is a
    forget of its own (SPEC §6, "Idempotency keys")."""
    owner = await memgate.workspace()
    other = await memgate.member(owner)
    agent = await memgate.agent(transport, await memgate.credential(owner))
    others = await memgate.agent(transport, await memgate.credential(other))
    await agent.remember("prefs", "v1", key="k")
    await agent.remember("prefs", "v2", key="k")
    theirs = await others.remember("prefs", "theirs", key="k")
    first = await agent.forget(namespace="prefs", key="k", idempotency_key="forget-1")
    again = await agent.forget(namespace="prefs", key="k", idempotency_key="forget-1")
    assert first.deleted == again.deleted == 2
    with pytest.raises(NotFoundError):
        await agent.forget(namespace="prefs", key="k", idempotency_key="forget-2")
    assert (await others.forget(namespace="prefs", key="k",
                                idempotency_key="forget-1")).deleted == 1
    with pytest.raises(NotFoundError):
        await others.forget(memory_id=theirs.memory_id)
    for each in (agent, others):
        await each.close()


async def test_the_idempotency_key_header_of_a_rest_forget(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    agent = await memgate.agent("rest", await memgate.credential(owner))
    stored = await agent.remember("n", "forgotten once")
    headers = {"Authorization": f"Bearer {await memgate.credential(owner)}",
               "Idempotency-Key": "header-key"}
    body = {"memoryId": stored.memory_id}
    answers = [await memgate.http.post("/api/agent/v1/memories/forget", json=body,
                                       headers=headers) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json() == {"deleted": 1}
    await agent.close()


async def test_someone_elses_memory_is_invisible_and_cannot_be_forgotten(
    memgate: Memgate, transport: str
) -> None:
    owner = await memgate.workspace()
    alice, bob = await memgate.member(owner), await memgate.member(owner)
    alice_agent = await memgate.agent(transport, await memgate.credential(alice))
    bob_agent = await memgate.agent(transport, await memgate.credential(bob))
    owner_agent = await memgate.agent(transport, await memgate.credential(owner))
    secret = await alice_agent.remember("private", "alice prefers tea")
    assert (await bob_agent.list()).memories == []
    assert (await owner_agent.list()).memories == []
    with pytest.raises(NotFoundError):
        await bob_agent.forget(memory_id=secret.memory_id)
    with pytest.raises(NotFoundError):
        await owner_agent.forget(memory_id=secret.memory_id)
    assert len((await alice_agent.list()).memories) == 1
    for agent in (alice_agent, bob_agent, owner_agent):
        await agent.close()


async def test_missing_or_unknown_or_revoked_credential_is_unauthenticated(
    memgate: Memgate, transport: str
) -> None:
    owner = await memgate.workspace()
    token = await memgate.credential(owner)
    for bad in ("mga_unknown", token):
        if bad == token:
            created = await memgate.ok(
                "POST",
                f"/api/w/{owner.workspace_id}/credentials",
                owner.token,
                {"name": "x", "scopes": ["memory:read"]},
            )
            await memgate.ok(
                "DELETE",
                f"/api/w/{owner.workspace_id}/credentials/{created['credentialId']}",
                owner.token,
            )
            bad = created["token"]
        agent = await memgate.agent(transport, bad)
        with pytest.raises(UnauthenticatedError):
            await agent.list()
        await agent.close()
    if transport == "rest":
        response = await memgate.http.post("/api/agent/v1/memories/list", json={})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "UNAUTHENTICATED"


async def test_a_credential_used_then_revoked_or_turned_off_is_refused_at_its_next_use(
    memgate: Memgate, transport: str
) -> None:
    """Governance keeps the principals it resolved; a change in the directory reaches it
    before the change is answered (SPEC §2.1: revocation is immediate)."""
    owner = await memgate.workspace()
    created = await memgate.ok("POST", f"/api/w/{owner.workspace_id}/credentials", owner.token,
                               {"name": "x", "scopes": ["memory:read", "memory:write"]})
    agent = await memgate.agent(transport, created["token"])
    other = await memgate.agent(transport, await memgate.credential(owner))
    await agent.remember("n", "used once")
    await other.remember("n", "used once too")
    await memgate.ok("DELETE",
                     f"/api/w/{owner.workspace_id}/credentials/{created['credentialId']}",
                     owner.token)
    with pytest.raises(UnauthenticatedError):
        await agent.list()
    await memgate.ok("PUT", f"/api/w/{owner.workspace_id}/ask-history/settings", owner.token,
                     {"agentMemoriesEnabled": False})
    with pytest.raises(AgentMemoryDisabledError):
        await other.remember("n", "after the owner turned agent memories off")
    await agent.close()
    await other.close()


async def test_missing_scope_is_insufficient_scope(memgate: Memgate, transport: str) -> None:
    owner = await memgate.workspace()
    reader = await memgate.agent(transport, await memgate.credential(owner, ("memory:read",)))
    nothing = await memgate.agent(transport, await memgate.credential(owner, ()))
    with pytest.raises(InsufficientScopeError):
        await reader.remember("n", "text")
    with pytest.raises(InsufficientScopeError):
        await nothing.list()
    assert (await reader.list()).memories == []
    await reader.close()
    await nothing.close()


async def test_a_viewer_cannot_be_granted_write(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    viewer = await memgate.member(owner, "viewer")
    response = await memgate.admin(
        "POST",
        f"/api/w/{owner.workspace_id}/credentials",
        viewer.token,
        {"name": "a", "scopes": ["memory:write"]},
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "INSUFFICIENT_SCOPE"
    assert await memgate.credential(viewer, ("memory:read",))


async def test_a_member_demoted_after_creating_a_credential_is_refused_at_use(
    memgate: Memgate, transport: str
) -> None:
    owner = await memgate.workspace()
    editor = await memgate.member(owner, "editor")
    agent = await memgate.agent(transport, await memgate.credential(editor))
    await agent.remember("n", "before demotion")
    await memgate.ok(
        "PATCH",
        f"/api/w/{owner.workspace_id}/members/{editor.member_id}",
        owner.token,
        {"role": "viewer"},
    )
    with pytest.raises(InsufficientScopeError):
        await agent.remember("n", "after demotion")
    assert [m.text for m in (await agent.list()).memories] == ["before demotion"]
    await agent.close()


async def test_agent_memories_are_off_by_default(memgate: Memgate, transport: str) -> None:
    owner = await memgate.workspace(enabled=False)
    settings = await memgate.ok(
        "GET", f"/api/w/{owner.workspace_id}/ask-history/settings", owner.token
    )
    assert settings == {"agentMemoriesEnabled": False, "retentionDays": 90, "nonRetaining": False}
    agent = await memgate.agent(transport, await memgate.credential(owner))
    with pytest.raises(AgentMemoryDisabledError):
        await agent.remember("n", "text")
    with pytest.raises(AgentMemoryDisabledError):
        await agent.list()
    await agent.close()


async def test_a_non_retaining_workspace_refuses_every_operation(
    memgate: Memgate, transport: str
) -> None:
    owner = await memgate.workspace(non_retaining=True)
    agent = await memgate.agent(transport, await memgate.credential(owner))
    for call in (agent.remember("n", "text"), agent.list(), agent.forget(memory_id="x")):
        with pytest.raises(NonRetainingWorkspaceError):
            await call
    await agent.close()


async def test_only_the_owner_changes_settings_and_roles(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    editor = await memgate.member(owner, "editor")
    path = f"/api/w/{owner.workspace_id}/ask-history/settings"
    refused = await memgate.admin("PUT", path, editor.token, {"agentMemoriesEnabled": False})
    assert refused.status_code == 403
    other = await memgate.workspace()
    foreign = await memgate.admin("GET", path, other.token)
    assert foreign.status_code == 404
    no_operator = await memgate.admin("POST", "/api/admin/workspaces", "wrong", {"name": "x"})
    assert no_operator.status_code == 401

"""What a member sees and deletes of their own agent memories; the owner's blind purge (§2.3)."""

from __future__ import annotations

from tests.conftest import Memgate


async def test_a_member_sees_and_deletes_their_own_memories_even_while_disabled(
    memgate: Memgate,
) -> None:
    owner = await memgate.workspace()
    alice, bob = await memgate.member(owner), await memgate.member(owner)
    alice_agent = await memgate.agent("bus", await memgate.credential(alice))
    bob_agent = await memgate.agent("bus", await memgate.credential(bob))
    kept = await alice_agent.remember("prefs", "alice likes tea")
    dropped = await alice_agent.remember("prefs", "alice likes coffee")
    await bob_agent.remember("prefs", "bob likes juice")
    path = f"/api/w/{owner.workspace_id}/ask-history/agent-memories"
    await memgate.ok(
        "PUT",
        f"/api/w/{owner.workspace_id}/ask-history/settings",
        owner.token,
        {"agentMemoriesEnabled": False},
    )

    mine = await memgate.ok("GET", path, alice.token)
    assert [m["text"] for m in mine["memories"]] == ["alice likes coffee", "alice likes tea"]
    deleted = await memgate.ok("DELETE", path, alice.token, {"memoryIds": [dropped.memory_id]})
    assert deleted == {"deleted": 1}
    not_hers = await memgate.ok("DELETE", path, alice.token, {"memoryIds": ["other-id"]})
    assert not_hers == {"deleted": 0}
    assert [m["memoryId"] for m in (await memgate.ok("GET", path, alice.token))["memories"]] == [
        kept.memory_id
    ]
    assert await memgate.ok("DELETE", path, alice.token) == {"deleted": 1}
    assert [m["text"] for m in (await memgate.ok("GET", path, bob.token))["memories"]] == [
        "bob likes juice"
    ]
    assert (await memgate.admin("GET", path, None)).status_code == 401
    await alice_agent.close()
    await bob_agent.close()


async def test_the_owner_deletes_every_agent_memory_without_reading_any(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    editor = await memgate.member(owner)
    for member in (owner, editor):
        agent = await memgate.agent("rest", await memgate.credential(member))
        await agent.remember("notes", f"a note of {member.member_id}")
    other_workspace = await memgate.workspace()
    outsider = await memgate.agent("rest", await memgate.credential(other_workspace))
    await outsider.remember("notes", "another workspace's note")

    purge = f"/api/w/{owner.workspace_id}/ask-history/settings/agent-memories"
    refused = await memgate.admin("DELETE", purge, editor.token)
    assert refused.status_code == 403
    purged = await memgate.ok("DELETE", purge, owner.token)
    assert purged == {"deleted": 2}  # a count, never content
    for member in (owner, editor):
        own = await memgate.ok(
            "GET", f"/api/w/{owner.workspace_id}/ask-history/agent-memories", member.token
        )
        assert own["memories"] == []
    assert len((await outsider.list()).memories) == 1


async def test_no_endpoint_lets_the_owner_read_a_members_memory(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    editor = await memgate.member(owner)
    agent = await memgate.agent("rest", await memgate.credential(editor))
    await agent.remember("private", "the editor's secret plan")
    owner_view = await memgate.ok(
        "GET", f"/api/w/{owner.workspace_id}/ask-history/agent-memories", owner.token
    )
    owner_agent = await memgate.agent("rest", await memgate.credential(owner))
    assert owner_view["memories"] == []
    assert (await owner_agent.list()).memories == []
    assert (await owner_agent.recall("secret plan")).memories == []

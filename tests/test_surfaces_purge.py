"""The owner's blind purge deletes agent memories only (SPEC §2.3; #28 finding 5)."""

from __future__ import annotations

from tests.conftest import Memgate
from tests.test_spaces import enable, space_of


async def test_the_owners_purge_of_agent_memories_leaves_members_space_memories(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    member = await memgate.member(owner, "editor")
    await enable(memgate, owner, member)
    space = await space_of(memgate, member)  # the owner has no share in it
    added = await memgate.ok("POST", f"/memory/{space['id']}/v3/memories/add/", member.token, {
        "messages": [{"role": "user", "content": "I keep my bike in the shed"}],
        "user_id": "alex"})
    assert [r["event"] for r in added["results"]] == ["ADD"]
    agent = await memgate.agent("rest", await memgate.credential(member))
    await agent.remember(namespace="notes", text="the user deploys on Fridays")

    purged = await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/ask-history/settings/"
                              "agent-memories", owner.token)
    assert purged["deleted"] == 1  # the agent's memory, and only it

    kept = await memgate.ok("POST", f"/memory/{space['id']}/v3/memories/", member.token,
                            {"filters": {"user_id": "alex"}})
    assert [m["memory"] for m in kept["results"]] == ["I keep my bike in the shed"]

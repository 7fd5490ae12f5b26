"""An erasure shreds exactly its subject's keys in backups (SPEC §5.3–§5.4; #28 findings 1–3):
one end user of a space and no one else, a conversation participant's sessions and events, and
an id however it is spelled."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from tests.conftest import Llm, Memgate, run_memgate
from tests.test_backup import ok
from tests.test_erased_bytes import canary, hits, needles
from tests.test_erasure import erase
from tests.test_mem0 import new_space
from tests.test_spaces import enable, space_of

USER = "64b7f0c2a1b2c3d4e5f607aa"  # an end user of the space, and a conversation participant
OTHER = "64b7f0c2a1b2c3d4e5f607bb"  # another end user of the same space: kept


async def add(memgate: Memgate, token: str, space: str, user_id: str, text: str) -> None:
    await memgate.ok("POST", f"/memory/{space}/v3/memories/add/", token,
                     {"messages": [{"role": "user", "content": text}], "user_id": user_id})


@pytest.mark.parametrize("spelling", [str.lower, str.upper], ids=["as-stored", "upper-case"])
async def test_erasing_one_end_user_of_a_space_shreds_them_and_no_one_else_in_a_backup(
        tmp_path: Path, spelling: Callable[[str], str]) -> None:
    secret, said, kept = canary(), canary(), canary()
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        owner = await memgate.workspace()
        await enable(memgate, owner, owner)
        space = (await space_of(memgate, owner))["id"]
        await add(memgate, owner.token, space, USER, f"my locker word is {secret}")
        await add(memgate, owner.token, space, OTHER, f"my favourite word is {kept}")
        session = await memgate.ok("POST", f"/memory/{space}/sessions", owner.token,
                                   {"participants": [USER]})
        await memgate.ok("POST", f"/memory/{space}/sessions/{session['id']}/events", owner.token,
                         {"body": {"content": f"I said {said}"},
                          "emitter": {"type": "user", "id": USER}, "eventType": "message"})
        data = memgate.settings.data_dir
    backup = tmp_path / "backup.jsonl"
    await ok("backup", "--data-dir", str(data), "--out", str(backup))

    async with AsyncExitStack() as stack:  # the id as sessions store it, or in upper case
        memgate = await run_memgate(tmp_path, stack)
        await erase(memgate, {"externalId": spelling(USER)}, owner.workspace_id)

    restored = tmp_path / "restored"
    await ok("restore", "--data-dir", str(restored / "data"), "--from", str(backup),
             "--keys-from", str(data))
    assert hits(restored, needles(kept)) != []  # the other end user's memory came back
    assert hits(restored, needles(secret)) == []  # the erased user's memory did not,
    assert hits(restored, needles(said)) == []  # nor their conversation,
    assert hits(restored, [USER.encode()]) == []  # nor their id (the entity row, the session)
    async with AsyncExitStack() as stack:
        again = await run_memgate(restored, stack)
        found = await again.ok("POST", f"/memory/{space}/v3/memories/", owner.token,
                               {"filters": {"user_id": OTHER}})
        assert [m["memory"] for m in found["results"]] == [f"my favourite word is {kept}"]


async def test_a_memory_extracted_from_a_two_person_conversation_goes_with_either_participant(
        tmp_path: Path, llm: Llm) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        space = await new_space(memgate, llm)
        owner = space.owner
        session = await memgate.ok("POST", f"/memory/{space.id}/sessions", owner.token,
                                   {"participants": [USER, OTHER]})
        fact = canary()
        nc = await memgate.internal("sessions")  # what extract_memories sends when it falls due
        reply = await nc.request("mem.int.spacemem.extract", json.dumps({
            "spaceId": space.id, "workspaceId": owner.workspace_id, "sessionId": session["id"],
            "participants": [USER, OTHER],
            "events": [{"sequenceId": 0, "text": f"user: my code word is {fact}"}]}).encode(),
            timeout=10)
        assert len(json.loads(reply.data)["result"]["memoryIds"]) == 1
        runs = {"filters": {"run_id": session["id"]}}
        listed = await memgate.ok("POST", f"/memory/{space.id}/v3/memories/", owner.token, runs)
        assert [m["memory"] for m in listed["results"]] == [f"my code word is {fact}"]

        result = await erase(memgate, {"externalId": OTHER}, owner.workspace_id)
        assert result["discovered"]["discovery"]["memory_store"] == 1
        listed = await memgate.ok("POST", f"/memory/{space.id}/v3/memories/", owner.token, runs)
        assert listed["results"] == []
        assert hits(memgate.settings.data_dir, needles(fact)) == []

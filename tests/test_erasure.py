"""Erasure requests (SPEC §5.3) over REST on the real system: intake → verification →
discovery → decision → execution → evidence, and the operator's metrics."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from memgate.storage.audit import read_entries, verify
from tests.test_erased_bytes import canary, hits, needles
from tests.conftest import ADMIN_TOKEN, Member, Memgate, eventually, run_memgate

BASE = "/api/admin/erasure-requests"
LAYERS = ["memory_store", "vector_index", "conversation_logs", "traces_logs", "eval_exports",
          "backups"]


async def remember(memgate: Memgate, token: str, text: str) -> None:
    await memgate.ok("POST", "/api/agent/v1/memories/remember", token,
                     {"namespace": "notes", "text": text})


async def recall(memgate: Memgate, token: str, query: str) -> list[str]:
    found = await memgate.ok("POST", "/api/agent/v1/memories/recall", token, {"query": query})
    return [m["text"] for m in found["memories"]]


async def completed(memgate: Memgate, request_id: str) -> dict[str, Any]:
    view: dict[str, Any] = {}

    async def done() -> bool:
        view.update(await memgate.ok("GET", f"{BASE}/{request_id}", ADMIN_TOKEN))
        assert view["status"] != "failed", view
        return view["status"] == "completed"

    await eventually(done)
    return view


async def erase(memgate: Memgate, subject: dict[str, str], workspace: str, *,
                holds: list[str] | None = None) -> dict[str, Any]:
    created = await memgate.ok("POST", BASE, ADMIN_TOKEN,
                               {"workspaceId": workspace, "subject": subject})
    request = f"{BASE}/{created['requestId']}"
    await memgate.ok("POST", f"{request}/verify", ADMIN_TOKEN,
                     {"method": "id-document", "verifiedBy": "dpo"})
    discovered = await memgate.ok("POST", f"{request}/discover", ADMIN_TOKEN)
    await memgate.ok("POST", f"{request}/decide", ADMIN_TOKEN,
                     {"holds": holds or [], "reason": "no exception applies"})
    await memgate.ok("POST", f"{request}/execute", ADMIN_TOKEN)
    return {"discovered": discovered, "done": await completed(memgate, created["requestId"])}


async def test_a_members_erasure_goes_through_every_stage_and_leaves_only_evidence(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    name = canary()  # the member's name: their identity
    added = await memgate.ok("POST", f"/api/w/{owner.workspace_id}/members", owner.token,
                             {"name": name, "role": "editor"})
    member = Member(owner.workspace_id, added["memberId"], added["memberToken"])
    mine, theirs = await memgate.credential(member), await memgate.credential(owner)
    secret = canary()
    for n in range(3):
        await remember(memgate, mine, f"the member prefers violet notebooks {secret} {n}")
    await remember(memgate, theirs, "the owner prefers violet pens")

    result = await erase(memgate, {"memberId": member.member_id}, owner.workspace_id)
    discovered, done = result["discovered"], result["done"]
    assert discovered["status"] == "discovered"
    assert discovered["discovery"]["memory_store"] == 3
    assert discovered["discovery"]["vector_index"] == 3
    assert set(discovered["discovery"]) == set(LAYERS)
    assert [e["layer"] for e in done["evidence"]] == LAYERS
    assert {e["layer"]: e["erased"] for e in done["evidence"]}["memory_store"] == 3
    assert member.member_id not in str(done)  # evidence holds no identity
    audited = [e for e in read_entries(memgate.settings.data_dir / "audit" / "audit.log")
               if e.get("action") == "erasure.layer"]
    assert [e["layer"] for e in audited] == LAYERS  # evidence in the hash-chained log too
    assert {e["source"] for e in audited} == {done["requestId"]}
    assert "violet" not in str(audited) and "member" not in str(audited)
    assert verify(memgate.settings.data_dir / "audit").ok

    assert await recall(memgate, theirs, "violet") == ["the owner prefers violet pens"]
    for token in (mine, member.token):  # the member ↔ identity mapping went too
        refused = await memgate.admin("POST", "/api/agent/v1/memories/recall", token,
                                      {"query": "violet"})
        assert refused.status_code == 401
    assert hits(memgate.settings.data_dir, needles(secret) + needles(name)) == []


async def test_nothing_is_resolved_before_identity_is_verified(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    created = await memgate.ok("POST", BASE, ADMIN_TOKEN, {
        "workspaceId": owner.workspace_id, "subject": {"memberId": owner.member_id}})
    assert created["status"] == "received"
    assert created["dueAt"] > created["receivedAt"]
    for stage in ("discover", "execute"):
        early = await memgate.admin("POST", f"{BASE}/{created['requestId']}/{stage}",
                                    ADMIN_TOKEN)
        assert (early.status_code, early.json()["error"]["code"]) == (409, "CONFLICT")


async def test_erasure_requests_are_the_operators_alone(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    body = {"workspaceId": owner.workspace_id, "subject": {"memberId": owner.member_id}}
    for token in (None, owner.token, "not-a-token"):
        refused = await memgate.admin("POST", BASE, token, body)
        assert refused.status_code == 401, refused.text
    assert (await memgate.admin("GET", f"{BASE}/metrics", owner.token)).status_code == 401


async def test_metrics_count_open_and_completed_requests(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    before = await memgate.ok("GET", f"{BASE}/metrics", ADMIN_TOKEN)
    await memgate.ok("POST", BASE, ADMIN_TOKEN, {
        "workspaceId": owner.workspace_id, "subject": {"externalId": "user-42"}})
    after = await memgate.ok("GET", f"{BASE}/metrics", ADMIN_TOKEN)
    assert after["open"] == before["open"] + 1
    assert after["overdue"] == 0


async def test_malformed_erasure_requests_are_refused(memgate: Memgate) -> None:
    owner: Member = await memgate.workspace()
    for body in ({"workspaceId": owner.workspace_id, "subject": {}},
                 {"workspaceId": owner.workspace_id,
                  "subject": {"memberId": "a", "externalId": "b"}},
                 {"subject": {"memberId": "a"}},
                 {"workspaceId": "x" * 500, "subject": {"memberId": "a"}}):
        refused = await memgate.admin("POST", BASE, ADMIN_TOKEN, body)
        assert refused.status_code == 400, refused.text
    unknown = await memgate.admin("GET", f"{BASE}/er_nope", ADMIN_TOKEN)
    assert unknown.status_code == 404
    created = await memgate.ok("POST", BASE, ADMIN_TOKEN, {
        "workspaceId": owner.workspace_id, "subject": {"memberId": owner.member_id}})
    request = f"{BASE}/{created['requestId']}"
    await memgate.ok("POST", f"{request}/verify", ADMIN_TOKEN, {"method": "m", "verifiedBy": "v"})
    await memgate.ok("POST", f"{request}/discover", ADMIN_TOKEN)
    bad_layer = await memgate.admin("POST", f"{request}/decide", ADMIN_TOKEN,
                                    {"holds": ["attic"], "reason": "x"})
    assert bad_layer.status_code == 400
    assert "attic" not in bad_layer.text  # the input is not echoed


async def test_a_layer_on_legal_hold_is_kept_and_named_in_the_decision(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    member = await memgate.member(owner, "editor")
    await remember(memgate, await memgate.credential(member), "kept for the court case")
    result = await erase(memgate, {"memberId": member.member_id}, owner.workspace_id,
                         holds=["backups", "eval_exports"])
    done = result["done"]
    assert done["holds"] == ["backups", "eval_exports"]
    assert [e["layer"] for e in done["evidence"]] == [
        "memory_store", "vector_index", "conversation_logs", "traces_logs"]


def admin_erase(url: str, workspace: str, member: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memgate.adapters", "admin", "erase", workspace,
         "--member", member, "--method", "id-document", "--verified-by", "dpo", "--url", url],
        env={**os.environ, "MEMGATE_ADMIN_TOKEN": ADMIN_TOKEN, "COLUMNS": "200"},
        capture_output=True, text=True, timeout=120)


async def test_memgate_admin_erase_runs_every_stage_and_prints_the_evidence(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    member = await memgate.member(owner, "editor")
    token = await memgate.credential(member)
    for n in range(5):
        await remember(memgate, token, f"the member collects blue stamps {n}")
    done = await asyncio.to_thread(admin_erase, str(memgate.http.base_url), owner.workspace_id,
                                   member.member_id)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6/6 layers" in done.stdout
    assert "memory_store" in done.stdout and "completed" in done.stdout
    gone = await memgate.admin("POST", "/api/agent/v1/memories/recall", token,
                               {"query": "blue stamps"})
    assert gone.status_code == 401  # the member is erased, their credentials with them


async def test_an_end_users_erasure_reaches_mem0_memories_conversations_and_every_byte(
        tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        secret, user = await end_user_erased(memgate)
    data = tmp_path / "data"  # stopped: nothing came back at shutdown
    assert hits(data, needles(secret)) == []
    assert hits(data, [user.encode()]) == []


async def end_user_erased(memgate: Memgate) -> tuple[str, str]:
    """Erase an end user of a space with a mem0 memory and a conversation; scan while running."""
    owner = await memgate.workspace()
    await memgate.ok("PATCH", f"/api/w/{owner.workspace_id}/members/{owner.member_id}",
                     owner.token, {"memorySpacesEnabled": True})
    space = (await memgate.ok("POST", "/memory/spaces", owner.token, {"description": "bot"}))["id"]
    user, other = "64b7f0c2a1b2c3d4e5f60718", "64b7f0c2a1b2c3d4e5f60799"
    secret, kept = canary(), canary()
    mem0 = {"Authorization": f"Token {owner.token}"}

    async def add(user_id: str, text: str) -> None:
        response = await memgate.http.post(f"/memory/{space}/v3/memories/add/", headers=mem0,
                                           json={"messages": [{"role": "user", "content": text}],
                                                 "user_id": user_id})
        assert response.status_code == 200, response.text

    async def search(user_id: str, query: str) -> list[str]:
        response = await memgate.http.post(f"/memory/{space}/v3/memories/search/", headers=mem0,
                                           json={"query": query,
                                                 "filters": {"user_id": user_id}})
        assert response.status_code == 200, response.text
        return [r["memory"] for r in response.json()["results"]]

    await add(user, f"my locker code word is {secret}")
    await add(other, f"my favourite word is {kept}")
    assert await search(user, secret) == [f"my locker code word is {secret}"]  # indexed, embedded
    session = await memgate.ok("POST", f"/memory/{space}/sessions", owner.token,
                               {"participants": [user]})
    await memgate.ok("POST", f"/memory/{space}/sessions/{session['id']}/events", owner.token,
                     {"body": {"content": f"remember {secret} for me"},
                      "emitter": {"type": "user", "id": user}, "eventType": "message"})

    result = await erase(memgate, {"externalId": user}, owner.workspace_id)
    found = result["discovered"]["discovery"]
    assert found["memory_store"] == 1 and found["vector_index"] == 1
    assert found["conversation_logs"] >= 1
    assert {e["layer"]: e["erased"] for e in result["done"]["evidence"]}["memory_store"] == 1

    assert await search(user, secret) == []
    assert await search(other, kept) == [f"my favourite word is {kept}"]
    gone = await memgate.admin("GET", f"/memory/{space}/sessions/{session['id']}/events",
                               owner.token)
    assert gone.status_code == 404 or gone.json().get("events") == []
    data = memgate.settings.data_dir
    assert hits(data, needles(secret)) == []  # running
    assert hits(data, needles(kept)) != []
    assert hits(data, [user.encode()]) == []  # the identity mapping went with the data
    return secret, user

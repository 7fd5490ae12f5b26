"""The REST routes the console reads (they are public API too): who a token is, the members and
credentials of a workspace, the erasure requests, the audit chain. Each refuses whoever may not
see it, and none shows a token."""

from __future__ import annotations

from tests.conftest import ADMIN_TOKEN, Memgate, eventually


async def test_me_names_the_operator_or_the_member_and_nobody_else(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    editor = await memgate.member(owner)
    operator = await memgate.ok("GET", "/api/me", ADMIN_TOKEN)
    assert {k: v for k, v in operator.items() if v} == {"kind": "operator"}
    me = await memgate.ok("GET", "/api/me", editor.token)
    assert me == {"kind": "member", "workspaceId": owner.workspace_id,
                  "memberId": editor.member_id, "name": "editor member", "role": "editor",
                  "memorySpacesEnabled": False}
    agent = await memgate.credential(editor)
    for token in (agent, "mgm_not-a-token", None):
        refused = await memgate.admin("GET", "/api/me", token)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "UNAUTHENTICATED"


async def test_members_and_credentials_are_listed_to_the_owner_alone_without_tokens(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    editor = await memgate.member(owner)
    token = await memgate.credential(editor)
    other = await memgate.workspace()
    path = f"/api/w/{owner.workspace_id}"

    members = await memgate.ok("GET", f"{path}/members", owner.token)
    assert sorted(m["memberId"] for m in members["members"]) == sorted(
        [owner.member_id, editor.member_id])
    listed = await memgate.admin("GET", f"{path}/credentials", owner.token)
    assert listed.status_code == 200
    [credential] = listed.json()["credentials"]
    assert credential["memberId"] == editor.member_id
    assert credential["scopes"] == ["memory:read", "memory:write"]
    assert token not in listed.text and "token" not in listed.text.lower()

    for route in ("members", "credentials"):
        assert (await memgate.admin("GET", f"{path}/{route}", editor.token)).status_code == 403
        assert (await memgate.admin("GET", f"{path}/{route}", other.token)).status_code == 404
        assert (await memgate.admin("GET", f"{path}/{route}", ADMIN_TOKEN)).status_code == 401

    await memgate.ok("DELETE", f"{path}/credentials/{credential['credentialId']}", owner.token)
    assert (await memgate.ok("GET", f"{path}/credentials", owner.token))["credentials"] == []


async def test_erasure_requests_are_listed_newest_first_to_the_operator_only(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    made = [await memgate.ok("POST", "/api/admin/erasure-requests", ADMIN_TOKEN,
                             {"workspaceId": owner.workspace_id,
                              "subject": {"externalId": f"user-{n}"}}) for n in range(3)]
    listed = await memgate.ok("GET", "/api/admin/erasure-requests", ADMIN_TOKEN)
    assert [r["requestId"] for r in listed["requests"]] == [
        r["requestId"] for r in reversed(made)]
    assert all("user-" not in str(r) for r in listed["requests"])  # never whom it is about
    refused = await memgate.admin("GET", "/api/admin/erasure-requests", owner.token)
    assert refused.status_code == 401


async def test_the_operator_verifies_the_audit_chain_and_sees_where_it_breaks(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    agent_token = await memgate.credential(owner)
    headers = {"Authorization": f"Bearer {agent_token}"}
    stored = await memgate.http.post("/api/agent/v1/memories/remember", headers=headers,
                                     json={"namespace": "n", "text": "a memory to forget"})
    forgot = await memgate.http.post("/api/agent/v1/memories/forget", headers=headers,
                                     json={"memoryId": stored.json()["memoryId"]})
    assert forgot.json() == {"deleted": 1}
    log = memgate.settings.data_dir / "audit" / "audit.log"

    async def verified() -> dict[str, object]:
        return await memgate.ok("POST", "/api/admin/audit/verify", ADMIN_TOKEN)

    async def logged() -> bool:
        return log.exists() and log.read_text().count("\n") >= 1

    await eventually(logged)
    good = await verified()
    assert good["ok"] is True and good["entries"] >= 1
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0].replace('"memories_deleted"', '"nothing"'), *lines[1:]])
                   + "\n")
    broken = await verified()
    assert broken["ok"] is False and broken["brokenLine"] == 1
    assert (await memgate.admin("POST", "/api/admin/audit/verify", owner.token)).status_code == 401

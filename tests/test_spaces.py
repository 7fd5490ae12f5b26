"""Memory spaces and sharing roles (SPEC §4.1, §4.5) over REST, on the real bus."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.conftest import Member, Memgate
from tests.test_erased_bytes import canary, hits, needles
from tests.test_up import cli

ALL = ["CAN_VIEW", "CAN_UPDATE", "CAN_DELETE", "CAN_SHARE"]


async def call(memgate: Memgate, method: str, path: str, token: str | None,
               body: dict[str, Any] | None = None, *, scheme: str = "Bearer") -> httpx.Response:
    headers = {"Authorization": f"{scheme} {token}"} if token else {}
    return await memgate.http.request(method, path, json=body, headers=headers)


async def enable(memgate: Memgate, owner: Member, member: Member, on: bool = True) -> None:
    await memgate.ok("PATCH", f"/api/w/{owner.workspace_id}/members/{member.member_id}",
                     owner.token, {"memorySpacesEnabled": on})


async def space_of(memgate: Memgate, member: Member, **body: Any) -> dict[str, Any]:
    return await memgate.ok("POST", "/memory/spaces", member.token,
                            {"description": "support bot", **body})


def code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


async def test_the_memory_space_api_is_refused_until_the_owner_enables_the_member(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    refused = await call(memgate, "POST", "/memory/spaces", owner.token, {"description": "x"})
    assert (refused.status_code, code(refused)) == (403, "MEMORY_SPACES_DISABLED")

    await enable(memgate, owner, owner)
    space = await space_of(memgate, owner)
    assert space["permissions"] == ALL
    assert space["id"] in space["rbacResourceId"]
    assert await memgate.ok("GET", f"/memory/spaces/{space['id']}", owner.token) == space

    await enable(memgate, owner, owner, on=False)  # all or nothing, at once
    again = await call(memgate, "GET", f"/memory/spaces/{space['id']}", owner.token)
    assert (again.status_code, code(again)) == (403, "MEMORY_SPACES_DISABLED")


async def test_a_space_names_only_an_allowed_model_at_an_allowed_host(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    unknown = await call(memgate, "POST", "/memory/spaces", owner.token, {
        "description": "x", "llmModelName": "gpt-9-ultra", "llmBaseUrl": "http://localhost:1"})
    assert (unknown.status_code, code(unknown)) == (422, "UNPROCESSABLE")
    assert "gpt-4o-mini" in unknown.json()["error"]["details"]["allowed"]

    elsewhere = await call(memgate, "POST", "/memory/spaces", owner.token, {
        "description": "x", "llmModelName": "gpt-4o-mini",
        "llmBaseUrl": "https://llm.example.com/v1"})
    assert (elsewhere.status_code, code(elsewhere)) == (422, "UNPROCESSABLE")
    assert elsewhere.json()["error"]["details"]["field"] == "llmBaseUrl"

    space = await space_of(memgate, owner, llmModelName="gpt-4o-mini",
                           llmBaseUrl="http://127.0.0.1:9999/v1")
    assert space["llmModelName"] == "gpt-4o-mini"


async def test_sharing_roles_grant_their_permissions_and_revocation_bites_at_once(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    reader = await memgate.member(owner, "viewer")
    writer = await memgate.member(owner, "editor")
    for member in (owner, reader, writer):
        await enable(memgate, owner, member)
    space = await space_of(memgate, owner)
    path = f"/memory/spaces/{space['id']}"

    unshared = await call(memgate, "GET", path, reader.token)
    assert (unshared.status_code, code(unshared)) == (404, "NOT_FOUND")

    await memgate.ok("PUT", f"{path}/shares/{reader.member_id}", owner.token,
                     {"role": "consumer"})
    await memgate.ok("PUT", f"{path}/shares/{writer.member_id}", owner.token, {"role": "editor"})
    assert (await memgate.ok("GET", path, reader.token))["permissions"] == ["CAN_VIEW"]
    assert (await memgate.ok("GET", path, writer.token))["permissions"] == [
        "CAN_VIEW", "CAN_UPDATE"]
    listed = await memgate.ok("GET", "/memory/spaces", reader.token)
    assert [s["id"] for s in listed["spaces"]] == [space["id"]]

    for member in (reader, writer):  # neither may delete the space or share it further
        assert (await call(memgate, "DELETE", path, member.token)).status_code == 403
        share = await call(memgate, "PUT", f"{path}/shares/{member.member_id}", member.token,
                           {"role": "owner"})
        assert (share.status_code, code(share)) == (403, "FORBIDDEN")

    await memgate.ok("DELETE", f"{path}/shares/{reader.member_id}", owner.token)
    gone = await call(memgate, "GET", path, reader.token)
    assert (gone.status_code, code(gone)) == (404, "NOT_FOUND")


async def test_a_member_of_another_workspace_never_sees_a_space(memgate: Memgate) -> None:
    owner, stranger = await memgate.workspace(), await memgate.workspace()
    await enable(memgate, owner, owner)
    await enable(memgate, stranger, stranger)
    space = await space_of(memgate, owner)
    seen = await call(memgate, "GET", f"/memory/spaces/{space['id']}", stranger.token)
    assert (seen.status_code, code(seen)) == (404, "NOT_FOUND")
    share = await call(memgate, "PUT", f"/memory/spaces/{space['id']}/shares/"
                       f"{stranger.member_id}", owner.token, {"role": "consumer"})
    assert (share.status_code, code(share)) == (404, "NOT_FOUND")


async def test_a_deleted_space_is_gone_for_everyone(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    space = await space_of(memgate, owner)
    user, secret = canary(), canary()  # an end user's id and what they said
    added = await call(memgate, "POST", f"/memory/{space['id']}/v3/memories/add/", owner.token,
                       {"messages": [{"role": "user", "content": f"my word is {secret}"}],
                        "user_id": user}, scheme="Token")
    assert added.status_code == 200, added.text
    await memgate.ok("DELETE", f"/memory/spaces/{space['id']}", owner.token)
    gone = await call(memgate, "GET", f"/memory/spaces/{space['id']}", owner.token)
    assert gone.status_code == 404
    assert (await memgate.ok("GET", "/memory/spaces", owner.token))["spaces"] == []
    assert hits(memgate.settings.data_dir, needles(user) + needles(secret)) == []  # off the disk


async def test_the_mem0_token_scheme_is_accepted_like_bearer(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    space = await space_of(memgate, owner)
    seen = await call(memgate, "GET", f"/memory/spaces/{space['id']}", owner.token,
                      scheme="Token")
    assert seen.status_code == 200


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/memory/spaces", {"description": "x" * 5000}),
    ("POST", "/memory/spaces", {"description": "x", "llmModelName": ""}),
    ("POST", "/memory/spaces", {"description": "x", "surprise": 1}),
    ("POST", "/memory/spaces", [1, 2]),
    ("PUT", "/memory/spaces/SPACE/shares/MEMBER", {"role": "god"}),
    ("PUT", "/memory/spaces/SPACE/shares/MEMBER", {}),
    ("GET", "/memory/spaces/" + "x" * 300, None),
])
async def test_malformed_space_requests_are_refused_in_the_error_shape(
        memgate: Memgate, method: str, path: str, body: Any) -> None:
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    space = await space_of(memgate, owner)
    path = path.replace("SPACE", space["id"]).replace("MEMBER", owner.member_id)
    anonymous = await memgate.http.request(method, path, json=body)
    assert anonymous.status_code == 401, anonymous.text
    refused = await call(memgate, method, path, owner.token, body)
    assert refused.status_code in (400, 404, 422), refused.text
    assert set(refused.json()["error"]) >= {"code", "message"}


async def test_the_admin_command_line_flags_members_and_manages_shares(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    member = await memgate.member(owner, "editor")
    url = str(memgate.http.base_url)
    for who in (owner, member):
        flagged = await asyncio.to_thread(cli, "memory-spaces", owner.workspace_id,
                                          who.member_id, "--url", url, token=owner.token)
        assert flagged["memorySpacesEnabled"] is True
    space = await space_of(memgate, owner)
    await asyncio.to_thread(cli, "share", space["id"], member.member_id, "editor", "--url", url,
                            token=owner.token)
    seen = await memgate.ok("GET", f"/memory/spaces/{space['id']}", member.token)
    assert seen["permissions"] == ["CAN_VIEW", "CAN_UPDATE"]
    await asyncio.to_thread(cli, "unshare", space["id"], member.member_id, "--url", url,
                            token=owner.token)
    assert (await call(memgate, "GET", f"/memory/spaces/{space['id']}",
                       member.token)).status_code == 404

"""The mem0-compatible API (SPEC §4.4): the real, unmodified `mem0ai` client against a running
memgate, sync and async, filters, errors, and fact extraction through a real local
OpenAI-compatible server (`tests/llm_server.py`, a separate process)."""

from __future__ import annotations

import os
import tempfile

# Before mem0 is imported: no analytics, and its config file in a temporary folder.
os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-"))

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import nats
import pytest
from mem0 import AsyncMemoryClient, MemoryClient
from mem0.exceptions import (
    AuthenticationError, MemoryNotFoundError, NetworkError, RateLimitError, ValidationError,
)
from mem0.memory.telemetry import client_telemetry

from tests.conftest import Llm, Member, Memgate, run_memgate

EMAIL = "alex.doe@example.com"


@pytest.fixture
async def memgate(tmp_path: Path) -> AsyncIterator[Memgate]:
    async with AsyncExitStack() as stack:
        yield await run_memgate(tmp_path, stack, mem0_llm_timeout_s=2.0,
                                mem0_extract_llm_timeout_s=2.0)


@dataclass
class Space:
    memgate: Memgate
    owner: Member
    id: str

    @property
    def host(self) -> str:
        return f"{str(self.memgate.http.base_url).rstrip('/')}/memory/{self.id}"

    async def client(self, token: str | None = None) -> MemoryClient:
        return await asyncio.to_thread(MemoryClient, host=self.host,
                                       api_key=token or self.owner.token)

    async def async_client(self, token: str | None = None) -> AsyncMemoryClient:
        # its constructor pings with `requests`, blocking: not on the loop that serves it
        return await asyncio.to_thread(AsyncMemoryClient, host=self.host,
                                       api_key=token or self.owner.token)

    async def member(self, role: str) -> Member:
        member = await self.memgate.member(self.owner, "editor")
        await enable(self.memgate, self.owner, member)
        await self.memgate.ok("PUT", f"/memory/spaces/{self.id}/shares/{member.member_id}",
                              self.owner.token, {"role": role})
        return member


async def enable(memgate: Memgate, owner: Member, member: Member, on: bool = True) -> None:
    await memgate.ok("PATCH", f"/api/w/{owner.workspace_id}/members/{member.member_id}",
                     owner.token, {"memorySpacesEnabled": on})


async def new_space(memgate: Memgate, llm: Llm | None = None) -> Space:
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    body: dict[str, Any] = {"description": "support bot"}
    if llm is not None:
        body |= {"llmModelName": "gpt-4o-mini", "llmBaseUrl": llm.url}
    space = await memgate.ok("POST", "/memory/spaces", owner.token, body)
    return Space(memgate, owner, space["id"])


def texts(results: list[dict[str, Any]]) -> list[str]:
    return sorted(r["memory"] for r in results)


def test_the_client_sends_no_telemetry() -> None:
    assert client_telemetry.posthog is None


async def test_the_sync_client_adds_gets_lists_searches_updates_and_deletes(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    assert (client.org_id, client.project_id) == (space.owner.workspace_id, space.id)

    added = await asyncio.to_thread(client.add, [
        {"role": "user", "content": f"I love hiking in the Alps, write to {EMAIL}"},
        {"role": "assistant", "content": "Noted: mountain trips in summer."},
    ], user_id="alex")
    assert [r["event"] for r in added["results"]] == ["ADD", "ADD"]
    assert added["results"][0]["memory"] == "I love hiking in the Alps, write to [EMAIL]"
    hiking = added["results"][0]["id"]
    await asyncio.to_thread(client.add, "I prefer tea over coffee", filters={"user_id": "sam"})

    got = await asyncio.to_thread(client.get, hiking)
    assert (got["id"], got["user_id"], got["memory"]) == (
        hiking, "alex", "I love hiking in the Alps, write to [EMAIL]")
    assert got["created_at"] and got["updated_at"]

    alex = await asyncio.to_thread(client.get_all, filters={"user_id": "alex"})
    assert alex["count"] == 2
    assert texts(alex["results"]) == ["I love hiking in the Alps, write to [EMAIL]",
                                      "Noted: mountain trips in summer."]
    paged = await asyncio.to_thread(client.get_all, filters={"user_id": "alex"}, page=2,
                                    page_size=1)
    assert (paged["count"], len(paged["results"]), paged["next"]) == (2, 1, None)
    assert (await asyncio.to_thread(client.get_all))["count"] == 3

    found = await asyncio.to_thread(client.search, "hiking in the Alps",
                                    filters={"user_id": "alex"}, top_k=1)
    [best] = found["results"]
    assert best["id"] == hiking and best["score"] > 0
    nobody = await asyncio.to_thread(client.search, "tea", filters={"user_id": "nobody"})
    assert nobody["results"] == []

    updated = await asyncio.to_thread(client.update, hiking, text="I love hiking in the Dolomites")
    assert (updated["id"], updated["memory"]) == (hiking, "I love hiking in the Dolomites")
    assert (await asyncio.to_thread(client.get, hiking))["memory"] == \
        "I love hiking in the Dolomites"
    history = await asyncio.to_thread(client.history, hiking)
    assert [(h["event"], h["old_memory"], h["new_memory"]) for h in history] == [
        ("ADD", None, "I love hiking in the Alps, write to [EMAIL]"),
        ("UPDATE", "I love hiking in the Alps, write to [EMAIL]",
         "I love hiking in the Dolomites")]
    assert (await asyncio.to_thread(client.get_all, filters={"user_id": "alex"}))["count"] == 2

    assert "deleted" in (await asyncio.to_thread(client.delete, hiking))["message"]
    with pytest.raises(MemoryNotFoundError):
        await asyncio.to_thread(client.get, hiking)
    with pytest.raises(MemoryNotFoundError):
        await asyncio.to_thread(client.history, hiking)

    await asyncio.to_thread(client.delete_all, filters={"user_id": "alex"})
    assert (await asyncio.to_thread(client.get_all, filters={"user_id": "alex"}))["count"] == 0
    assert texts((await asyncio.to_thread(client.get_all))["results"]) == [
        "I prefer tea over coffee"]


async def test_filters_flat_and_or_select_by_user_agent_and_run(memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    for text, ids in [("alex with the bot in run one", {"user_id": "alex", "agent_id": "bot",
                                                        "run_id": "r1"}),
                      ("alex alone in run two", {"user_id": "alex", "run_id": "r2"}),
                      ("sam with the bot", {"user_id": "sam", "agent_id": "bot"}),
                      ("the bot by itself", {"agent_id": "bot"})]:
        await asyncio.to_thread(client.add, text, **ids)

    async def listed(filters: dict[str, Any]) -> list[str]:
        page = await asyncio.to_thread(client.get_all, filters=filters)
        return texts(page["results"])

    assert await listed({"user_id": "alex"}) == ["alex alone in run two",
                                                 "alex with the bot in run one"]
    assert await listed({"user_id": "alex", "agent_id": "bot"}) == [
        "alex with the bot in run one"]
    assert await listed({"AND": [{"agent_id": "bot"}, {"user_id": "*"}]}) == [
        "alex with the bot in run one", "sam with the bot"]
    assert await listed({"OR": [{"run_id": "r2"}, {"user_id": "sam"}]}) == [
        "alex alone in run two", "sam with the bot"]
    assert await listed({"AND": [{"agent_id": "bot"},
                                 {"OR": [{"user_id": "sam"}, {"run_id": "r1"}]}]}) == [
        "alex with the bot in run one", "sam with the bot"]
    assert await listed({"user_id": {"in": ["sam", "kim"]}}) == ["sam with the bot"]

    found = await asyncio.to_thread(client.search, "bot",
                                    filters={"OR": [{"user_id": "sam"}, {"run_id": "r1"}]})
    assert texts(found["results"]) == ["alex with the bot in run one", "sam with the bot"]

    await asyncio.to_thread(client.delete_all, filters={"OR": [{"run_id": "r1"},
                                                               {"user_id": "sam"}]})
    assert await listed({"agent_id": "bot"}) == ["the bot by itself"]
    with pytest.raises(ValidationError):  # nothing to delete by: refused, not "all"
        await asyncio.to_thread(client.delete_all)
    with pytest.raises(ValidationError):
        await asyncio.to_thread(client.get_all, filters={"app_id": "x"})


async def test_the_async_client_works_too(memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.async_client()
    try:
        assert client.project_id == space.id
        added = await client.add("Kim is allergic to peanuts", user_id="kim")
        [memory] = added["results"]
        assert (await client.get(memory["id"]))["user_id"] == "kim"
        assert (await client.get_all(filters={"user_id": "kim"}))["count"] == 1
        found = await client.search("peanut allergy", filters={"user_id": "kim"})
        assert [r["id"] for r in found["results"]] == [memory["id"]]
        await client.update(memory["id"], text="Kim is allergic to peanuts and shellfish")
        assert len(await client.history(memory["id"])) == 2
        await client.delete(memory["id"])
        with pytest.raises(MemoryNotFoundError):
            await client.get(memory["id"])
        await client.add("Kim lives in Haifa", user_id="kim")
        await client.delete_all(filters={"user_id": "kim"})
        assert (await client.get_all(filters={"user_id": "kim"}))["count"] == 0
    finally:
        await client.async_client.aclose()


async def test_errors_become_the_clients_own_exceptions(memgate: Memgate) -> None:
    space = await new_space(memgate)
    with pytest.raises(ValueError, match="Error: "):  # the constructor's ping, with `detail`
        await space.client("not-a-token")
    client = await space.client()
    with pytest.raises(MemoryNotFoundError):
        await asyncio.to_thread(client.get, "0123456789abcdef")
    with pytest.raises(MemoryNotFoundError):
        await asyncio.to_thread(client.delete, "x" * 500)
    with pytest.raises(ValidationError):
        await asyncio.to_thread(client.add, "hello")  # about nobody
    with pytest.raises(ValidationError):
        await asyncio.to_thread(client.add, f"{EMAIL}", user_id="alex")  # nothing left

    consumer = await space.member("consumer")
    reader = await space.client(consumer.token)
    await asyncio.to_thread(client.add, "the office opens at nine", user_id="alex")
    assert (await asyncio.to_thread(reader.get_all))["count"] == 1
    with pytest.raises(AuthenticationError):  # 403: a consumer may not add
        await asyncio.to_thread(reader.add, "I was here", user_id="alex")
    with pytest.raises(AuthenticationError):
        await asyncio.to_thread(reader.delete_all, filters={"user_id": "alex"})

    editor = await space.member("editor")
    writer = await space.client(editor.token)
    await enable(memgate, space.owner, editor, on=False)  # the flag is all or nothing, at once
    with pytest.raises(AuthenticationError):
        await asyncio.to_thread(writer.get_all)

    client.client.headers["Authorization"] = "Token revoked-or-unknown"
    with pytest.raises(AuthenticationError):
        await asyncio.to_thread(client.get_all)


async def test_the_rate_limit_is_the_clients_rate_limit_error(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, limit_remembers_per_hour=3)
        space = await new_space(memgate)
        client = await space.client()
        await asyncio.to_thread(client.add, "one", user_id="alex")
        await asyncio.to_thread(client.add, "two", user_id="alex")
        with pytest.raises(RateLimitError) as refused:  # the third is taken, the fourth not:
            await asyncio.to_thread(client.add, [  # all or nothing, the third is taken back
                {"role": "user", "content": "three"}, {"role": "user", "content": "four"}],
                user_id="alex")
        assert refused.value.debug_info["retry_after"] >= 1
        assert texts((await asyncio.to_thread(client.get_all))["results"]) == ["one", "two"]
        with pytest.raises(RateLimitError):
            await asyncio.to_thread(client.add, "five", user_id="alex")


HOSTILE: list[tuple[str, str, Any]] = [
    ("POST", "/v3/memories/add/", b"not json"),
    ("POST", "/v3/memories/add/", b"[1, 2]"),
    ("POST", "/v3/memories/add/", {"messages": []}),
    ("POST", "/v3/memories/add/", {"messages": [{"role": "user", "content": 7}],
                                   "user_id": "a"}),
    ("POST", "/v3/memories/add/", {"messages": [{"content": "x" * 1001}], "user_id": "a"}),
    ("POST", "/v3/memories/add/", {"messages": [{"content": "hi"}], "user_id": "a" * 201}),
    ("POST", "/v3/memories/add/", {"messages": [{"content": "hi"}],
                                   "filters": {"user_id": "*"}}),
    ("POST", "/v3/memories/search/", {"query": ""}),
    ("POST", "/v3/memories/search/", {"query": "x", "top_k": 0}),
    ("POST", "/v3/memories/search/", {"query": "x", "top_k": 10_000}),
    ("POST", "/v3/memories/search/", {"query": "x", "filters": {"user_id": 5}}),
    ("POST", "/v3/memories/search/", {"query": "x", "filters": {"OR": []}}),
    ("POST", "/v3/memories/search/", {"query": "x", "filters": {"NOT": []}}),
    ("POST", "/v3/memories/search/", {"query": "x", "filters": {"created_at": "2024"}}),
    ("POST", "/v3/memories/", {"filters": {"AND": [{"AND": [{"AND": [{"AND": [{"AND": [
        {"AND": [{"AND": [{"user_id": "a"}]}]}]}]}]}]}]}}),
    ("POST", "/v3/memories/", {"filters": {"OR": [{"user_id": str(i)} for i in range(500)]}}),
    ("POST", "/v3/memories/?page=abc", {}),
    ("POST", "/v3/memories/?page_size=0", {}),
    ("POST", "/v3/memories/?page=99999999999999999999", {}),
    ("POST", "/v3/memories/", b"{\"filters\": "),
    ("POST", "/v3/memories/", b"{\"filters\": " + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("POST", "/v3/memories/", b"{\"filters\": {\"user_id\": " + b"[" * 900 + b"]" * 900
     + b"}}"),
    ("POST", "/v3/memories/search/", b"{\"query\": \"x\", \"filters\": " + b"{\"OR\": [" * 400
     + b"{}" + b"]}" * 400 + b"}"),
    ("PUT", "/v1/memories/abc/", {"text": ""}),
    ("GET", "/v1/memories/" + "x" * 300 + "/", None),
    ("DELETE", "/v1/memories/?filters=__import__('os').system('true')", None),
    ("DELETE", "/v1/memories/?filters=" + "[" * 3000, None),
    ("DELETE", "/v1/memories/?filters=" + "{'user_id': 'a'}" * 400, None),
    ("DELETE", "/v1/memories/?filters=[1,2]", None),
    ("DELETE", "/v1/memories/?filters={'user_id': {'in': 'abc'}}", None),
    ("DELETE", "/v1/memories/", None),
]


async def test_hostile_input_gets_a_4xx_with_mem0s_detail_never_a_500(memgate: Memgate) -> None:
    space = await new_space(memgate)
    headers = {"Authorization": f"Token {space.owner.token}"}
    for method, path, body in HOSTILE:
        content = body if isinstance(body, bytes) else None
        data = None if isinstance(body, bytes) or body is None else body
        response = await memgate.http.request(method, f"/memory/{space.id}{path}",
                                              headers=headers, content=content, json=data)
        assert 400 <= response.status_code < 500, (method, path, response.text)
        error = response.json()
        assert error["detail"] and error["error"]["code"], (method, path)
    # without a credential, the refusal is about the credential, whatever the body
    response = await memgate.http.post(f"/memory/{space.id}/v3/memories/add/", content=b"{")
    assert response.status_code == 401
    response = await memgate.http.get("/memory/nope/v1/ping/", headers=headers)
    assert response.status_code == 404


async def test_add_extracts_facts_through_the_spaces_llm_which_sees_only_masked_text(
        memgate: Memgate, llm: Llm) -> None:
    space = await new_space(memgate, llm)
    client = await space.client()
    added = await asyncio.to_thread(client.add, [
        {"role": "user", "content": f"My email is {EMAIL} and I am vegetarian."},
        {"role": "assistant", "content": "Got it, no meat."},
    ], user_id="alex")
    assert texts(added["results"]) == ["Got it, no meat.",
                                       "My email is [EMAIL] and I am vegetarian."]
    received = await llm.received()
    assert EMAIL not in received and "[EMAIL]" in received
    assert json.loads(received)[0]["model"] == "gpt-4o-mini"
    assert (await asyncio.to_thread(client.get_all, filters={"user_id": "alex"}))["count"] == 2

    verbatim = await asyncio.to_thread(client.add, "store me as I am", user_id="alex",
                                       infer=False)
    assert texts(verbatim["results"]) == ["store me as I am"]
    assert len(json.loads(await llm.received())) == 1  # infer=False: the LLM was not asked


async def test_a_delete_sent_again_under_its_idempotency_key_answers_as_the_first(
        memgate: Memgate) -> None:
    """A mem0 delete whose answer was lost, sent again with the same `Idempotency-Key`, is
    told the memory was deleted (not 404); another key is a delete of its own."""
    space = await new_space(memgate)
    client = await space.client()
    added = await asyncio.to_thread(client.add, "delete me once", user_id="alex", infer=False)
    path = f"/memory/{space.id}/v1/memories/{added['results'][0]['id']}/"
    auth = {"Authorization": f"Token {space.owner.token}"}
    first, again, other, too_long = [
        await memgate.http.delete(path, headers={**auth, "Idempotency-Key": key})
        for key in ("delete-1", "delete-1", "delete-2", "k" * 256)]
    assert first.status_code == again.status_code == 200, first.text
    assert again.json() == first.json()
    assert other.status_code == 404
    assert too_long.status_code == 400


async def test_an_add_sent_again_under_its_idempotency_key_answers_as_the_first(
        memgate: Memgate, llm: Llm) -> None:
    """A mem0 add whose answer was lost, sent again with the same `Idempotency-Key`, gets the
    memories the first stored, writes nothing and asks the model nothing; another key is an
    add of its own; a key too long is refused before anything is stored."""
    space = await new_space(memgate, llm)
    path = f"/memory/{space.id}/v3/memories/add/"
    auth = {"Authorization": f"Token {space.owner.token}"}
    body = {"messages": [{"role": "user", "content": "I am vegetarian."},
                         {"role": "assistant", "content": "Got it, no meat."}],
            "user_id": "alex", "metadata": {"topic": "food"}}
    first, again, other, too_long = [
        await memgate.http.post(path, json=body, headers={**auth, "Idempotency-Key": key})
        for key in ("add-1", "add-1", "add-2", "k" * 256)]
    assert first.status_code == again.status_code == other.status_code == 200, first.text
    assert len(first.json()["results"]) == 2
    assert again.json() == first.json()
    assert len(json.loads(await llm.received())) == 2  # the first add's and the other key's
    assert {r["id"] for r in other.json()["results"]}.isdisjoint(
        r["id"] for r in first.json()["results"])
    assert too_long.status_code == 400
    client = await space.client()
    assert (await asyncio.to_thread(client.get_all, filters={"user_id": "alex"}))["count"] == 4

    verbatim = {"messages": [{"role": "user", "content": "store me as I am"}], "infer": False,
                "user_id": "sam"}
    stored = [await memgate.http.post(path, json=verbatim,
                                      headers={**auth, "Idempotency-Key": "verbatim"})
              for _ in range(2)]
    assert stored[0].json() == stored[1].json()
    assert (await asyncio.to_thread(client.get_all, filters={"user_id": "sam"}))["count"] == 1


@pytest.mark.parametrize("mode", ["5xx", "badjson", "slow"])
async def test_an_llm_failure_stores_nothing(memgate: Memgate, llm: Llm, mode: str) -> None:
    space = await new_space(memgate, llm)
    client = await space.client()
    await llm.mode(mode)
    with pytest.raises(NetworkError):  # 503 UNAVAILABLE: retry later
        await asyncio.to_thread(client.add, "I am vegetarian", user_id="alex")
    assert (await asyncio.to_thread(client.get_all))["count"] == 0


async def extract(memgate: Memgate, space: Space, events: list[tuple[int, str]]) -> Any:
    """What the sessions actor sends when extract_memories falls due (its own NATS login)."""
    nc = await nats.connect(memgate.nats_url, **memgate.bus.login("sessions"))
    try:
        request = {"spaceId": space.id, "workspaceId": space.owner.workspace_id,
                   "sessionId": "s1", "participants": ["a" * 24],
                   "events": [{"sequenceId": s, "text": t} for s, t in events]}
        reply = await nc.request("mem.int.spacemem.extract", json.dumps(request).encode(),
                                 timeout=10)
        return json.loads(reply.data)
    finally:
        await nc.close()


async def test_extraction_for_a_session_stores_facts_derived_from_its_events(
        tmp_path: Path, llm: Llm) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, mem0_extract_llm_timeout_s=2.0)
        space = await new_space(memgate, llm)
        await llm.mode("5xx")
        failed = await extract(memgate, space, [(0, "user: I moved to Haifa")])
        assert failed["error"]["code"] == "UNAVAILABLE"
        await llm.mode("badjson")
        assert (await extract(memgate, space, [(0, "user: x")]))["error"]["code"] == \
            "UNAVAILABLE"
        await llm.mode("ok")
        done = await extract(memgate, space, [(0, f"user: I moved to Haifa, {EMAIL}"),
                                              (1, "agent: Welcome to Haifa!")])
        ids = done["result"]["memoryIds"]
        assert len(ids) == 2
        assert EMAIL not in await llm.received()
        again = await extract(memgate, space, [(0, f"user: I moved to Haifa, {EMAIL}"),
                                               (1, "agent: Welcome to Haifa!")])
        assert again["result"]["memoryIds"] == ids  # a retried extraction makes no copies
        client = await space.client()
        page = await asyncio.to_thread(client.get_all, filters={"run_id": "s1"})
        assert texts(page["results"]) == ["I moved to Haifa, [EMAIL]", "Welcome to Haifa!"]
        assert {r["user_id"] for r in page["results"]} == {"a" * 24}
        path = memgate.settings.data_dir / "partitions" / "p0" / "memories.duckdb"
    with duckdb.connect(str(path), read_only=True) as db:
        rows = db.execute("SELECT key, derived_from FROM memories ORDER BY seq").fetchall()
    assert sorted({key for key, _ in rows}) == sorted(ids)  # the failures left nothing behind
    assert all(derived == ["s1/0", "s1/1"] for _, derived in rows)

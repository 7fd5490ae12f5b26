"""Masking and sizes on every surface (SPEC §3.2, §4.1, §4.2, §4.4; #28 findings 6, 7, 8), on
the real app: sizes checked before masking, masking off the event loop, every free-text field
masked or refused, and a space's LLM reached only at an origin the operator allows."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import duckdb
import httpx

from memgate.app.settings import Settings
from memgate.contracts.sessions import EVENT_BODY_MAX_BYTES
from tests.conftest import ADMIN_TOKEN, LLM_PORT, Llm, Memgate, run_memgate
from tests.test_sessions import (
    PARTICIPANT, Space, call, enable, new_session, new_space, refused,
)


def event(content: Any, **fields: Any) -> dict[str, Any]:
    return {"body": {"content": content}, "emitter": {"type": "user", "id": PARTICIPANT},
            "eventType": "message", **fields}


async def answered_meanwhile(slow: Awaitable[httpx.Response],
                             probe: Callable[[], Awaitable[object]],
                             ) -> tuple[httpx.Response, list[float]]:
    """`slow`'s answer, and how long each probe sent while it was in flight took."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(slow)
    took: list[float] = []
    while not task.done():
        start = loop.time()
        await probe()
        took.append(loop.time() - start)
    return await task, took


# --- finding 6: sizes before masking, linear masking, off the event loop ---


async def test_an_oversized_event_body_of_one_word_is_refused_before_it_is_masked(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    loop = asyncio.get_running_loop()
    start = loop.time()
    response = await call(memgate, "POST", f"{space.sessions}/{session['id']}/events",
                          space.owner.token, event("a" * 50_000))
    took = loop.time() - start
    error = refused(response, 400, "VALIDATION_ERROR")
    assert error["details"]["problems"][0]["field"] == "body"
    assert took < 1.0, took  # 9.2 s when the masker ran first, quadratic on one long word


async def test_an_agents_list_answers_promptly_while_a_maximal_hostile_batch_is_masked(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    agent = await memgate.new_agent("rest")
    await agent.remember("notes", "the quarterly report is due on Friday")
    # the costliest text per character for the masker (a phone candidate every 15 characters),
    # in events each just under the body limit, as many as the 4 MiB request limit carries
    unit = "+1234567890123 "
    content = unit * ((EVENT_BODY_MAX_BYTES - 64) // len(unit))
    batch = {"events": [event(content) for _ in range(120)]}
    assert len(json.dumps(batch)) < memgate.settings.max_body_bytes
    response, took = await answered_meanwhile(
        call(memgate, "POST", f"{space.sessions}/{session['id']}/events", space.owner.token,
             batch),
        agent.list)
    assert response.status_code == 200, response.text
    assert len(took) >= 2 and max(took) < 1.0, took


async def test_healthz_answers_promptly_while_a_mem0_add_of_long_words_is_masked(
        memgate: Memgate, llm: Llm) -> None:
    space = await new_space(memgate, llmModelName="gpt-4o-mini", llmBaseUrl=llm.url)
    messages = [{"role": "user", "content": "a" * 10_000} for _ in range(16)]
    response, took = await answered_meanwhile(
        memgate.http.post(f"/memory/{space.space_id}/v3/memories/add/",
                          json={"messages": messages, "user_id": "alex"},
                          headers={"Authorization": f"Token {space.owner.token}"}),
        lambda: memgate.http.get("/healthz"))
    assert response.status_code == 200, response.text
    assert max(took) < 1.0, took  # /healthz waited 5.2 s beside a 5.6 s add


# --- finding 8: a space's LLM only at an origin the operator allows, checked at every call ---


async def add(memgate: Memgate, space: Space, content: str = "I like green tea") -> httpx.Response:
    return await memgate.http.post(f"/memory/{space.space_id}/v3/memories/add/",
                                   json={"messages": [{"role": "user", "content": content}],
                                         "user_id": "alex"},
                                   headers={"Authorization": f"Token {space.owner.token}"})


async def test_no_llm_origin_is_allowed_until_the_operator_lists_one(
        tmp_path: Path, llm: Llm) -> None:
    assert Settings().spaces_llm_origins == []
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, spaces_llm_origins=[])
        owner = await memgate.workspace()
        await enable(memgate, owner, owner)
        for url in (llm.url, "http://localhost:8080/v1", "http://127.0.0.1:4222"):
            response = await call(memgate, "POST", "/memory/spaces", owner.token, {
                "description": "x", "llmModelName": "gpt-4o-mini", "llmBaseUrl": url})
            error = refused(response, 422, "UNPROCESSABLE")
            assert error["details"]["field"] == "llmBaseUrl"
            assert error["details"]["allowedOrigins"] == []


async def test_a_base_url_names_an_allowed_origin_exactly_with_nothing_but_a_path(
        memgate: Memgate, llm: Llm) -> None:
    owner = await memgate.workspace()
    await enable(memgate, owner, owner)
    root = llm.root.removeprefix("http://")
    for url in (f"http://user:secret@{root}/v1", f"{llm.root}/admin/shutdown#",
                f"{llm.root}/admin/reset?x=", f"{llm.root}/v1/../admin",
                f"{llm.root}/%2e%2e/admin", f"https://{root}/v1", "http://127.0.0.1:4222/v1",
                f"http://localhost:{LLM_PORT}/v1", f"http://{root}:/v1"):
        response = await call(memgate, "POST", "/memory/spaces", owner.token, {
            "description": "x", "llmModelName": "gpt-4o-mini", "llmBaseUrl": url})
        assert refused(response, 422, "UNPROCESSABLE")["details"]["field"] == "llmBaseUrl", url
    assert json.loads(await llm.received()) == []
    space = await new_space(memgate, llmModelName="gpt-4o-mini", llmBaseUrl=llm.url)
    assert (await add(memgate, space)).status_code == 200
    assert len(json.loads(await llm.received())) == 1


async def test_a_space_stops_calling_an_origin_the_operator_has_removed(
        tmp_path: Path, llm: Llm) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        space = await new_space(memgate, llmModelName="gpt-4o-mini", llmBaseUrl=llm.url)
        assert (await add(memgate, space)).status_code == 200
    async with AsyncExitStack() as stack:  # the same data, the origin no longer listed
        memgate = await run_memgate(tmp_path, stack, spaces_llm_origins=["http://127.0.0.1:9"])
        response = await add(memgate, space)
        assert refused(response, 422, "UNPROCESSABLE")["details"]["field"] == "llmBaseUrl"
    assert len(json.loads(await llm.received())) == 1  # the second add asked nothing


async def test_an_llm_failure_reads_alike_whatever_is_at_the_address(
        memgate: Memgate, llm: Llm) -> None:
    answers = []
    closed = await new_space(memgate, llmModelName="gpt-4o-mini",
                             llmBaseUrl="http://127.0.0.1:9/v1")
    answers.append(await add(memgate, closed))
    refusing = await new_space(memgate, llmModelName="gpt-4o-mini", llmBaseUrl=llm.url)
    for mode in ("5xx", "badjson"):
        await llm.mode(mode)
        answers.append(await add(memgate, refusing))
    bodies = [(a.status_code, a.json()) for a in answers]
    assert bodies[0][0] == 503 and bodies[0][1]["error"]["code"] == "UNAVAILABLE"
    assert all(body == bodies[0] for body in bodies), bodies
    assert "500" not in json.dumps(bodies[1][1])


# --- finding 7: every free-text field masked or refused ---

EMAIL = "jane.roe@example.com"
PHONE = "415-555-0100"
CARD = "4111-1111-1111-1111"


async def test_a_spaces_description_is_masked_before_it_is_stored(memgate: Memgate) -> None:
    space = await new_space(memgate, description=f"bot for {EMAIL}, {PHONE}, card {CARD}")
    masked = "bot for [EMAIL], [PHONE], card [CARD]"
    shown = await memgate.ok("GET", f"/memory/spaces/{space.space_id}", space.owner.token)
    assert shown["description"] == masked
    listed = await memgate.ok("GET", "/memory/spaces", space.owner.token)
    assert [s["description"] for s in listed["spaces"]] == [masked]
    for path in memgate.settings.data_dir.glob("spaces.duckdb*"):
        data = path.read_bytes()
        assert EMAIL.encode() not in data and CARD.encode() not in data, path


async def test_a_null_event_body_is_refused_not_a_500(memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    events = f"{space.sessions}/{session['id']}/events"
    for body in (event("", body=None), {"events": [event("fine"), event("", body=None)]}):
        error = refused(await call(memgate, "POST", events, space.owner.token, body), 400,
                        "VALIDATION_ERROR")
        assert "null" in json.dumps(error["details"])
    stored = await memgate.ok("POST", events, space.owner.token, event("fine"))
    edit = await call(memgate, "PATCH", f"{events}/{stored['sequenceId']}", space.owner.token,
                      {"body": None})
    refused(edit, 400, "VALIDATION_ERROR")


async def test_personal_data_in_an_emitter_id_or_event_type_is_refused(
        memgate: Memgate) -> None:
    space = await new_space(memgate)
    session = await new_session(memgate, space)
    events = f"{space.sessions}/{session['id']}/events"
    one = event("hello", emitter={"type": "user", "id": CARD})
    error = refused(await call(memgate, "POST", events, space.owner.token, one), 400,
                    "AGENT_MEMORY_PERSONAL_DATA")
    assert error["details"]["field"] == "emitter.id"
    error = refused(await call(memgate, "POST", events, space.owner.token,
                               event("hello", eventType=PHONE)),
                    400, "AGENT_MEMORY_PERSONAL_DATA")
    assert error["details"]["field"] == "eventType"
    batch = {"events": [event("fine"), event("hello", emitter={"type": PHONE, "id": "bot"})]}
    error = refused(await call(memgate, "POST", events, space.owner.token, batch), 400,
                    "AGENT_MEMORY_PERSONAL_DATA")
    assert error["details"]["field"] == "events.1.emitter.type"
    listed = await memgate.ok("GET", f"{events}?lastN=20", space.owner.token)
    assert listed["events"] == []  # all or none: nothing was stored
    # a participant's ObjectId (18 digits in a row in this one) is an id, not a number
    stored = await memgate.ok("POST", events, space.owner.token, event("hello"))
    assert stored["emitter"] == {"type": "user", "id": PARTICIPANT}


async def test_a_mem0_message_role_is_one_of_the_four_roles(memgate: Memgate, llm: Llm) -> None:
    space = await new_space(memgate, llmModelName="gpt-4o-mini", llmBaseUrl=llm.url)
    response = await memgate.http.post(
        f"/memory/{space.space_id}/v3/memories/add/",
        json={"messages": [{"role": EMAIL, "content": "I like green tea"}], "user_id": "alex"},
        headers={"Authorization": f"Token {space.owner.token}"})
    error = refused(response, 400, "VALIDATION_ERROR")
    assert error["details"]["problems"][0]["field"] == "messages.0.role"
    assert json.loads(await llm.received()) == []  # the LLM saw nothing
    for role in ("user", "assistant", "system", "tool"):
        response = await memgate.http.post(
            f"/memory/{space.space_id}/v3/memories/add/",
            json={"messages": [{"role": role, "content": "I like green tea"}],
                  "user_id": "alex"},
            headers={"Authorization": f"Token {space.owner.token}"})
        assert response.status_code == 200, (role, response.text)
    assert EMAIL not in await llm.received()


async def test_a_lone_surrogate_in_a_body_is_refused_with_400_not_a_500(memgate: Memgate) -> None:
    space = await new_space(memgate)
    for path in (f"/memory/{space.space_id}/v3/memories/search/", "/memory/spaces"):
        response = await memgate.http.post(
            path, content=b'{"query": "\\ud800", "description": "\\ud800"}',
            headers={"Authorization": f"Token {space.owner.token}",
                     "Content-Type": "application/json"})
        refused(response, 400, "VALIDATION_ERROR")


async def test_a_password_stored_in_an_older_spaces_llm_url_is_never_shown(
        tmp_path: Path, llm: Llm) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        space = await new_space(memgate, llmModelName="gpt-4o-mini", llmBaseUrl=llm.url)
    root = llm.url.removeprefix("http://")
    with duckdb.connect(str(memgate.settings.data_dir / "spaces.duckdb")) as db:  # as before
        db.execute("UPDATE spaces SET llm_base_url = ? WHERE space_id = ?",
                   [f"http://user:secret@{root}", space.space_id])
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        shown = await memgate.ok("GET", f"/memory/spaces/{space.space_id}", space.owner.token)
        assert shown["llmBaseUrl"] == llm.url
        response = await add(memgate, space)  # and it is not called with it
        assert refused(response, 422, "UNPROCESSABLE")["details"]["field"] == "llmBaseUrl"
    assert json.loads(await llm.received()) == []


async def test_an_older_spaces_raw_description_is_shown_masked(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        space = await new_space(memgate)
    with duckdb.connect(str(memgate.settings.data_dir / "spaces.duckdb")) as db:  # as before
        db.execute("UPDATE spaces SET description = ? WHERE space_id = ?",
                   [f"bot for {EMAIL}", space.space_id])
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack)
        shown = await memgate.ok("GET", f"/memory/spaces/{space.space_id}", space.owner.token)
        assert shown["description"] == "bot for [EMAIL]"


# --- every free-text field: the directory's and registry's names, an erasure's reason ---


async def test_names_holding_personal_data_are_refused_and_an_erasure_reason_is_masked(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()
    ws = f"/api/w/{owner.workspace_id}"
    named = f"ops for {EMAIL} {CARD}"
    for path, token, body in (
            ("/api/admin/workspaces", ADMIN_TOKEN, {"name": named}),
            ("/api/admin/nats-agents", ADMIN_TOKEN, {"name": named}),
            (f"{ws}/members", owner.token, {"name": named, "role": "editor"}),
            (f"{ws}/credentials", owner.token, {"name": named, "scopes": ["memory:read"]}),
            (f"{ws}/collections", owner.token, {"name": named}),
            (f"{ws}/context-sets", owner.token, {"name": named})):
        response = await memgate.admin("POST", path, token, body)
        error = refused(response, 400, "AGENT_MEMORY_PERSONAL_DATA")
        assert error["details"] == {"field": "name"}, path
        assert EMAIL not in response.text and "4111" not in response.text

    member = await memgate.member(owner)
    created = await memgate.ok("POST", "/api/admin/erasure-requests", ADMIN_TOKEN,
                               {"workspaceId": owner.workspace_id,
                                "subject": {"memberId": member.member_id}})
    request = f"/api/admin/erasure-requests/{created['requestId']}"
    await memgate.ok("POST", f"{request}/verify", ADMIN_TOKEN,
                     {"method": "id-document", "verifiedBy": "dpo"})
    await memgate.ok("POST", f"{request}/discover", ADMIN_TOKEN)
    await memgate.ok("POST", f"{request}/decide", ADMIN_TOKEN,
                     {"holds": [], "reason": f"asked by {EMAIL}, card {CARD}"})
    view = await memgate.ok("GET", request, ADMIN_TOKEN)
    assert EMAIL not in json.dumps(view) and "4111" not in json.dumps(view)
    assert view["decisionReason"].startswith("asked by ")

"""Hostile input gets a clear error, never a 500, a hang or a memory spike (issue 8).

One real system for the module (nats-server, every actor, uvicorn): explicit cases for each
finding of the hostile-input review, then a bounded hypothesis run over every route of the app's
own OpenAPI document and over the MCP tools, asserting no 5xx and the one error shape (SPEC §3.10).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import quote

import httpx
import nats
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memgate.bus import subjects
from memgate.contracts import HTTP_STATUS, ErrorCode
from tests.conftest import ADMIN_TOKEN, Member, Memgate, run_memgate

pytestmark = pytest.mark.asyncio(loop_scope="module")

EDGE_INSTANTS = ("9999-12-31T23:59:59-12:00", "0001-01-01T00:00:00+14:00",
                 "9999-12-31T23:59:59.999999Z", "0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z")
MCP_HEADERS = {"Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def memgate(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Memgate]:
    async with AsyncExitStack() as stack:
        yield await run_memgate(tmp_path_factory.mktemp("hostile"), stack)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def owner(memgate: Memgate) -> Member:
    return await memgate.workspace()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def agent_token(memgate: Memgate, owner: Member) -> str:
    return await memgate.credential(owner)


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    """The status, and the one error shape of SPEC §3.10 with a code that maps to it."""
    assert response.status_code == status, response.text[:500]
    assert_error_shape(response)
    if code is not None:
        assert response.json()["error"]["code"] == code


def assert_error_shape(response: httpx.Response) -> None:
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) - {"detail"} == {"error"}, body
    error = body["error"]
    if "detail" in body:  # the mem0-compatible routes add mem0's own field (SPEC §4.4)
        assert "/memory/" in response.request.url.path and body["detail"] == error["message"]
    assert set(error) == {"code", "message", "details"}, error
    assert isinstance(error["message"], str)
    assert isinstance(error["details"], dict)
    assert HTTP_STATUS[ErrorCode(error["code"])] == response.status_code, error


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def cursor(data: str) -> str:
    return base64.urlsafe_b64encode(data.encode()).decode().rstrip("=")


CRAFTED_CURSORS = (
    cursor('{"s": 1e400, "t": "2024-01-01T00:00:00"}'),
    cursor(json.dumps({"s": 10**40, "t": "2024-01-01T00:00:00"})),
    cursor('{"s": -1, "t": "2024-01-01T00:00:00"}'),
    cursor('{"s": true, "t": "2024-01-01T00:00:00"}'),
    cursor('{"s": 1, "t": "0000-99-99"}'),
    cursor("[1, 2]"), "not-base64!!", "",
)


async def mcp_call(memgate: Memgate, token: str | None, tool: str,
                   arguments: Any) -> httpx.Response:
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": tool, "arguments": arguments}}
    return await memgate.http.post("/mcp", json=message, headers={**MCP_HEADERS, **bearer(token)})


def tool_error_code(response: httpx.Response) -> str | None:
    """The SPEC §3.10 code of an MCP tool error (None for a success)."""
    assert response.status_code == 200, response.text[:500]
    result = response.json()["result"]
    if not result.get("isError"):
        return None
    return str(result["structuredContent"]["error"]["code"])


# --- dates at the calendar's edges ---


@pytest.mark.parametrize("instant", EDGE_INSTANTS)
async def test_instants_at_the_calendars_edges_are_refused_with_400(
        memgate: Memgate, owner: Member, agent_token: str, instant: str) -> None:
    headers = bearer(agent_token)
    for operation, body in (("recall", {"query": "deploys", "asOf": instant}),
                            ("list", {"asOf": instant})):
        response = await memgate.http.post(f"/api/agent/v1/memories/{operation}", json=body,
                                           headers=headers)
        assert_error(response, 400, "VALIDATION_ERROR")
        assert response.json()["error"]["details"]["problems"][0]["field"] == "asOf"
        assert tool_error_code(await mcp_call(
            memgate, agent_token, f"{operation}_memories" if operation == "recall"
            else "list_memories", body)) == "VALIDATION_ERROR"
    collection = await memgate.ok("POST", f"/api/w/{owner.workspace_id}/collections", owner.token,
                                  {"name": "handbook"})
    response = await memgate.admin("PUT", f"/api/w/{owner.workspace_id}/documents/doc-edge",
                                   owner.token, {"collectionId": collection["collectionId"],
                                                 "expiresAt": instant})
    assert_error(response, 400, "VALIDATION_ERROR")


# --- crafted list cursors ---


@pytest.mark.parametrize("crafted", CRAFTED_CURSORS)
async def test_crafted_list_cursors_are_refused_with_400(
        memgate: Memgate, owner: Member, agent_token: str, crafted: str) -> None:
    response = await memgate.http.post("/api/agent/v1/memories/list", json={"cursor": crafted},
                                       headers=bearer(agent_token))
    assert_error(response, 400, "VALIDATION_ERROR")
    assert tool_error_code(await mcp_call(memgate, agent_token, "list_memories",
                                          {"cursor": crafted})) == "VALIDATION_ERROR"
    response = await memgate.http.get(f"/api/w/{owner.workspace_id}/ask-history/agent-memories",
                                      params={"cursor": crafted}, headers=bearer(owner.token))
    assert_error(response, 400, "VALIDATION_ERROR")


# --- large bodies: valid ones are carried, long ids refused, oversize refused unread ---


async def test_long_ids_in_lists_are_refused_with_400(
        memgate: Memgate, owner: Member, agent_token: str) -> None:
    long_ids = [f"{i:04d}" + "x" * 60_000 for i in range(20)]
    response = await memgate.http.post(
        "/api/agent/v1/memories/remember", headers=bearer(agent_token),
        json={"namespace": "ops", "text": "deploys on fridays", "citations": long_ids})
    assert_error(response, 400, "VALIDATION_ERROR")
    thousand_long = [f"{i:04d}" + "y" * 1_000 for i in range(1_000)]
    response = await memgate.admin("POST", f"/api/w/{owner.workspace_id}/context-sets",
                                   owner.token, {"name": "big", "documentIds": thousand_long})
    assert_error(response, 400, "VALIDATION_ERROR")
    response = await memgate.http.request(
        "DELETE", f"/api/w/{owner.workspace_id}/ask-history/agent-memories",
        json={"memoryIds": thousand_long}, headers=bearer(owner.token))
    assert_error(response, 400, "VALIDATION_ERROR")


async def test_large_valid_bodies_cross_the_bus(memgate: Memgate, owner: Member) -> None:
    collection = await memgate.ok("POST", f"/api/w/{owner.workspace_id}/collections", owner.token,
                                  {"name": "manuals"})
    passages = [{"passageId": f"p{i}", "text": "lorem ipsum " * 7_500} for i in range(20)]
    body = {"collectionId": collection["collectionId"], "passages": passages}
    assert len(json.dumps(body)) > 1_800_000  # beyond nats-server's default 1 MB payload
    document = await memgate.ok("PUT", f"/api/w/{owner.workspace_id}/documents/big-manual",
                                owner.token, body)
    assert document["version"] == 1
    ids = [f"{i:04d}" + "d" * 124 for i in range(1_000)]  # 1,000 ids of the longest length
    saved = await memgate.ok("POST", f"/api/w/{owner.workspace_id}/context-sets", owner.token,
                             {"name": "wide", "documentIds": ids, "collectionIds": ids})
    assert saved["contextSetId"]
    deleted = await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/ask-history/agent-memories",
                               owner.token, {"memoryIds": ids})
    assert deleted["deleted"] == 0


async def test_a_declared_oversize_body_is_refused_before_it_is_sent(memgate: Memgate) -> None:
    """Only the headers of a 200 MB request are sent: the 413 arrives without the body."""
    host, port = memgate.http.base_url.host, memgate.http.base_url.port
    assert port is not None
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /api/agent/v1/memories/remember HTTP/1.1\r\nHost: memgate\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 200000000\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 413 "), head


async def test_a_streamed_oversize_body_is_refused_with_413(memgate: Memgate) -> None:
    limit = memgate.settings.max_body_bytes

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked transfer
        yield b'{"namespace": "ops", "text": "'
        for _ in range(limit // 65_536 + 2):
            yield b"a" * 65_536
        yield b'"}'

    response = await memgate.http.post("/api/agent/v1/memories/remember", content=chunks(),
                                       headers={"Content-Type": "application/json"})
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")
    assert response.json()["error"]["details"]["limitBytes"] == limit


async def test_a_body_just_over_the_limit_is_refused_on_mcp_too(memgate: Memgate,
                                                               agent_token: str) -> None:
    padding = "a" * memgate.settings.max_body_bytes
    response = await memgate.http.post("/mcp", content=json.dumps({"pad": padding}),
                                       headers={**MCP_HEADERS, **bearer(agent_token)})
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")


# --- MCP: authenticated before anything, and no endless stream ---


async def test_unauthenticated_mcp_is_refused_before_a_stream_opens(
        memgate: Memgate, agent_token: str) -> None:
    for token in (None, "mg_not-a-credential"):
        for method in ("GET", "POST", "DELETE"):
            response = await asyncio.wait_for(memgate.http.request(
                method, "/mcp", headers={**MCP_HEADERS, **bearer(token)}, json={}), timeout=5)
            assert_error(response, 401, "UNAUTHENTICATED")
    response = await asyncio.wait_for(memgate.http.get(
        "/mcp", headers={**MCP_HEADERS, **bearer(agent_token)}), timeout=5)
    assert_error(response, 405, "METHOD_NOT_ALLOWED")
    assert response.headers["allow"] == "POST"


async def test_many_anonymous_mcp_requests_hold_no_connections_open(memgate: Memgate) -> None:
    responses = await asyncio.wait_for(asyncio.gather(
        *(memgate.http.get("/mcp", headers=MCP_HEADERS) for _ in range(200))), timeout=30)
    assert {r.status_code for r in responses} == {401}


# --- the framework's own refusals take the error shape ---


async def test_framework_refusals_take_the_one_error_shape(memgate: Memgate,
                                                           agent_token: str) -> None:
    headers = {**bearer(agent_token), "Content-Type": "application/json"}
    for raw in (b'{"namespace": ', b"[1, 2]", b"null", b"\xff\xfe", b'"text"', b"NaN"):
        response = await memgate.http.post("/api/agent/v1/memories/remember", content=raw,
                                           headers=headers)
        assert_error(response, 400, "VALIDATION_ERROR")
    assert_error(await memgate.http.get("/api/no/such/route"), 404, "NOT_FOUND")
    assert_error(await memgate.http.get("/api/agent/v1/memories/remember"), 405,
                 "METHOD_NOT_ALLOWED")
    too_long = "w" * 129
    assert_error(await memgate.http.get(f"/api/w/{too_long}/ask-history/settings",
                                        headers=bearer(agent_token)), 400, "VALIDATION_ERROR")


async def test_openapi_lists_every_real_status_and_no_422(memgate: Memgate) -> None:
    document = (await memgate.http.get("/openapi.json")).json()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    error_schema = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            statuses = set(operation["responses"])
            # FastAPI's own 422 nowhere; memgate's UNPROCESSABLE on memory-space routes only
            assert "422" not in statuses or path.startswith("/memory/"), (method, path)
            if path == "/healthz":
                continue
            assert {"200", "400", "401", "403", "404", "413", "503"} <= statuses, (method, path)
            for status in statuses - {"200"}:
                content = operation["responses"][status]["content"]["application/json"]
                assert content["schema"] == error_schema, (method, path, status)
    remember = document["paths"]["/api/agent/v1/memories/remember"]["post"]["responses"]
    assert {"409", "429"} <= set(remember)


# --- authentication before anything that reveals existence; REST and the bus agree ---


async def test_context_set_ids_cannot_be_probed_without_a_credential(
        memgate: Memgate, owner: Member) -> None:
    saved = await memgate.ok("POST", f"/api/w/{owner.workspace_id}/context-sets", owner.token,
                             {"name": "probe"})
    stranger = await memgate.workspace()
    path = f"/api/w/{owner.workspace_id}/credentials"
    for token, status in ((None, 401), ("mg_unknown", 401), (stranger.token, 404)):
        answers = [await memgate.admin("POST", path, token,
                                       {"name": "x", "scopes": [], "contextSetId": set_id})
                   for set_id in (saved["contextSetId"], "cs_does_not_exist")]
        for response in answers:
            assert_error(response, status)
        assert answers[0].json() == answers[1].json()
        update = [await memgate.admin("PUT", f"/api/w/{owner.workspace_id}/context-sets/{set_id}",
                                      token, {"name": "renamed"})
                  for set_id in (saved["contextSetId"], "cs_does_not_exist")]
        assert [r.status_code for r in update] == [status, status]


BAD_BODIES: list[dict[str, Any]] = [
    {"namespace": "", "text": ""}, {"text": 5}, {"namespace": "ops", "text": "x", "extra": 1},
    {"namespace": "ops", "text": "x" * 5_000},
]


@pytest.mark.parametrize("body", BAD_BODIES)
async def test_rest_and_the_bus_answer_a_bad_unauthenticated_request_alike(
        memgate: Memgate, body: dict[str, Any]) -> None:
    credential = await memgate.nats_agent()
    nc = await nats.connect(memgate.nats_url, nkeys_seed_str=credential["seed"],
                            inbox_prefix=credential["inboxPrefix"])
    try:
        for token in (None, "mg_unknown"):
            rest = await memgate.http.post("/api/agent/v1/memories/remember", json=body,
                                           headers=bearer(token))
            assert_error(rest, 401, "UNAUTHENTICATED")
            reply = await nc.request(subjects.REMEMBER,
                                     json.dumps({"token": token, "body": body}).encode(), timeout=5)
            assert json.loads(reply.data)["error"]["code"] == "UNAUTHENTICATED"
            mcp = await mcp_call(memgate, token, "remember_memory", body)
            assert_error(mcp, 401, "UNAUTHENTICATED")
    finally:
        await nc.drain()


async def test_with_a_credential_a_bad_body_is_400_on_rest_and_the_bus(
        memgate: Memgate, agent_token: str) -> None:
    rest = await memgate.http.post("/api/agent/v1/memories/remember", json=BAD_BODIES[0],
                                   headers=bearer(agent_token))
    assert_error(rest, 400, "VALIDATION_ERROR")
    fields = {p["field"] for p in rest.json()["error"]["details"]["problems"]}
    assert fields == {"namespace", "text"}
    viewer = await memgate.member(await memgate.workspace(), "viewer")
    response = await memgate.http.post("/api/agent/v1/memories/remember", json=BAD_BODIES[0],
                                       headers=bearer(await memgate.credential(
                                           viewer, ("memory:read",))))
    assert_error(response, 403, "INSUFFICIENT_SCOPE")  # authorised before validated, as on the bus


# --- property: every route of the OpenAPI document, hostile input, never a 5xx ---

SPECIAL = st.sampled_from(EDGE_INSTANTS + CRAFTED_CURSORS + (
    " ", "\x00", "../..", "%00", "'; DROP TABLE memories;--", "mem.evt.p0.memory", "Ⅻ" * 50))
HOSTILE_TEXT = st.one_of(
    SPECIAL, st.text(max_size=200),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "😀", "\\", '"']),
              st.integers(0, 70_000)),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), HOSTILE_TEXT,
)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=20)
VALUES = st.one_of(SPECIAL, SCALARS, JSON, st.lists(HOSTILE_TEXT, max_size=1_200))


@st.composite
def bodies(draw: st.DrawFn, fields: tuple[str, ...]) -> bytes:
    """A body near the schema (its own field names, hostile values), any JSON, or not JSON."""
    choice = draw(st.integers(0, 4))
    if choice >= 3 and fields:
        chosen = draw(st.lists(st.sampled_from(fields), unique=True, max_size=len(fields)))
        return json.dumps({name: draw(VALUES) for name in chosen}).encode()
    if choice == 1:
        return json.dumps(draw(JSON)).encode()
    if choice == 2:
        return draw(st.binary(max_size=300))
    return b""


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, tuple[str, ...],
                                                            tuple[str, ...]]]:
    """(method, path, body field names, query names) of every operation the document lists."""
    schemas = document["components"]["schemas"]
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            fields: tuple[str, ...] = ()
            content = operation.get("requestBody", {}).get("content", {}).get(
                "application/json", {})
            ref = json.dumps(content.get("schema", {}))
            for name, schema in schemas.items():
                if f'"#/components/schemas/{name}"' in ref:
                    fields += tuple(schema.get("properties", {}))
            query = tuple(p["name"] for p in operation.get("parameters", []) if p["in"] == "query")
            yield method.upper(), path, fields, query


async def test_no_route_answers_hostile_input_with_a_5xx_or_another_shape(
        memgate: Memgate) -> None:
    owner = await memgate.workspace()  # its own workspace: the run may change or purge it
    tokens = [None, "mg_not-a-credential", owner.token, ADMIN_TOKEN,
              await memgate.credential(owner)]
    document = (await memgate.http.get("/openapi.json")).json()
    ops = sorted(operations(document))
    assert len(ops) >= 20
    base_url = str(memgate.http.base_url)
    ids = st.one_of(st.just(owner.workspace_id), st.text(min_size=1, max_size=300))

    @settings(max_examples=600, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def hostile(client: httpx.Client, data: st.DataObject) -> None:
        method, path, fields, query = data.draw(st.sampled_from(ops))
        for name in path.split("{")[1:]:
            name = name.split("}")[0]
            path = path.replace(f"{{{name}}}", quote(data.draw(ids), safe=""))
        params = {name: data.draw(st.one_of(SPECIAL, st.text(max_size=300)))  # URLs stay short
                  for name in query if data.draw(st.booleans())}
        response = client.request(
            method, path, content=data.draw(bodies(fields)), params=params,
            headers={"Content-Type": "application/json", **bearer(data.draw(
                st.sampled_from(tokens)))})
        assert response.status_code < 500, (method, path, response.text[:300])
        assert response.status_code != 422
        if response.status_code >= 400:
            assert_error_shape(response)

    def run() -> None:
        with httpx.Client(base_url=base_url, timeout=15) as client:
            hostile(client)

    await asyncio.wait_for(asyncio.to_thread(run), timeout=120)


async def test_no_mcp_tool_answers_hostile_arguments_with_internal(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    tokens = [owner.token, await memgate.credential(owner)]
    base_url = str(memgate.http.base_url)
    tools = {"remember_memory": ("namespace", "text", "key", "collectionId", "citations"),
             "recall_memories": ("query", "namespace", "collectionId", "asOf", "limit"),
             "list_memories": ("namespace", "key", "collectionId", "asOf", "limit", "cursor"),
             "forget_memory": ("memoryId", "namespace", "key")}

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def hostile(client: httpx.Client, data: st.DataObject) -> None:
        tool = data.draw(st.sampled_from(sorted(tools)))
        chosen = data.draw(st.lists(st.sampled_from(tools[tool]), unique=True))
        arguments = {name: data.draw(VALUES) for name in chosen}
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": tool, "arguments": arguments}}
        response = client.post("/mcp", content=json.dumps(message).encode(), headers={
            **MCP_HEADERS, **bearer(data.draw(st.sampled_from(tokens)))})
        assert response.status_code < 500, response.text[:300]
        if response.status_code >= 400:
            assert_error_shape(response)
            return
        answer = response.json()
        if "error" in answer:  # a JSON-RPC refusal of the SDK (the arguments' schema)
            assert answer["error"]["code"] != -32603, answer  # never an internal error
            return
        result = answer["result"]
        if result.get("isError"):
            code = (result.get("structuredContent") or {}).get("error", {}).get("code")
            assert code != "INTERNAL", result

    def run() -> None:
        with httpx.Client(base_url=base_url, timeout=15) as client:
            hostile(client)

    await asyncio.wait_for(asyncio.to_thread(run), timeout=120)

"""Every route of the app's own OpenAPI document, under hypothesis (#28: findings 6-8 and the
surfaces as a whole): oversized and adversarial strings (one long word, many spaces, long digit
runs, '@'-heavy text, deep nesting), bogus and valid credentials, valid and hostile ids. No
request gets a 5xx, every 4xx is the §3.10 error shape, and none takes more than 2 s of the
server's CPU (memgate runs in this process, on a thread of its own: the CPU this process spends
while one request is in flight is an upper bound of that request's).

Path and query values are at most 2,000 characters: a longer request line is refused by the
HTTP server (h11) before the app sees it."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import ADMIN_TOKEN, run_memgate
from tests.test_sessions import PARTICIPANT

CPU_LIMIT_S = 2.0
WALL_LIMIT_S = 30.0  # a hang, not a slow request on a loaded machine
START_TIMEOUT_S = 60.0


@dataclass
class Running:
    base_url: str
    routes: list[tuple[str, str]]  # (method, path template)
    known: dict[str, str]  # a valid value for each path parameter
    tokens: list[str | None]
    body_keys: list[str]
    stop: threading.Event = field(default_factory=threading.Event)


def _serve(tmp_path: Path, box: dict[str, Any], ready: threading.Event,
           stop: threading.Event) -> None:
    async def main() -> None:
        try:
            async with AsyncExitStack() as stack:
                memgate = await run_memgate(tmp_path, stack)
                owner = await memgate.workspace()
                await memgate.ok("PATCH", f"/api/w/{owner.workspace_id}/members/"
                                 f"{owner.member_id}", owner.token, {"memorySpacesEnabled": True})
                agent = await memgate.credential(owner)
                space = await memgate.ok("POST", "/memory/spaces", owner.token,
                                         {"description": "fuzzed"})
                session = await memgate.ok("POST", f"/memory/{space['id']}/sessions",
                                           owner.token, {"participants": [PARTICIPANT]})
                await memgate.ok("POST", f"/memory/{space['id']}/sessions/{session['id']}"
                                 "/events", owner.token, {
                                     "body": {"content": "hi"}, "eventType": "message",
                                     "emitter": {"type": "user", "id": PARTICIPANT}})
                added = await memgate.http.post(
                    f"/memory/{space['id']}/v3/memories/add/",
                    json={"messages": [{"role": "user", "content": "green tea"}],
                          "user_id": "alex"},
                    headers={"Authorization": f"Token {owner.token}"})
                assert added.status_code == 200, added.text
                box.update(
                    base_url=str(memgate.http.base_url),
                    openapi=(await memgate.http.get("/openapi.json")).json(),
                    known={"wsId": owner.workspace_id, "memberId": owner.member_id,
                           "spaceId": space["id"], "sessionId": session["id"],
                           "sequenceId": "0", "memoryId": added.json()["results"][0]["id"]},
                    tokens=[None, "bogus", "mgm_" + "x" * 43, "Bearer", ADMIN_TOKEN,
                            owner.token, agent])
                ready.set()
                await asyncio.to_thread(stop.wait)
        except BaseException as exc:
            box["error"] = exc
            ready.set()

    asyncio.run(main())


def _body_keys(openapi: dict[str, Any]) -> list[str]:
    """Every property name any schema of the document names, and the mem0 client's."""
    keys = {"messages", "role", "content", "user_id", "agent_id", "run_id", "filters", "query",
            "text", "top_k", "infer", "metadata", "events", "body", "emitter", "eventType"}
    for schema in openapi.get("components", {}).get("schemas", {}).values():
        keys |= set(schema.get("properties", {}))
    return sorted(keys)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    box: dict[str, Any] = {}
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=_serve, args=(tmp_path_factory.mktemp("openapi"), box,
                                                   ready, stop), daemon=True)
    thread.start()
    assert ready.wait(START_TIMEOUT_S), "memgate did not start"
    if "error" in box:
        raise box["error"]
    routes = [(method.upper(), path) for path, operations in box["openapi"]["paths"].items()
              for method in operations]
    try:
        yield Running(box["base_url"], routes, box["known"], box["tokens"],
                      _body_keys(box["openapi"]), stop)
    finally:
        stop.set()
        thread.join(START_TIMEOUT_S)


# --- what a hostile client sends ---

SIZES = (5_000, 40_000, 400_000)
UNITS = ("a", " ", "1", "a@", "+1234567890123 ", "1-", "x@y.zz ", "account no. 12345678")
long_strings = st.builds(lambda unit, size, prefix: prefix + unit * (size // len(unit)),
                         st.sampled_from(UNITS), st.sampled_from(SIZES),
                         st.sampled_from(["", "account", "a@", "+"]))
short_strings = st.one_of(st.text(max_size=30), st.sampled_from(
    ["jane.doe@example.com", "4111 1111 1111 1111", "+1 415 555 0100", "67500a000000000000000001",
     "../..", "%00", "\x00", "\ud800", "*", "[EMAIL]"]))
strings = st.one_of(short_strings, long_strings)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | strings,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6)


def _nested(depth: int, opener: str, closer: str) -> bytes:
    return (opener * depth + "1" + closer * depth).encode()


raw_bodies = st.sampled_from([
    _nested(40, "[", "]"), _nested(5_000, "[", "]"), _nested(200_000, "[", "]"),
    _nested(5_000, '{"a":', "}"), b"{", b"\xff\xfe", b"null", b'"' + b"a" * 100_000 + b'"',
    b"[" + b"1," * 500_000 + b"1]", b"{" + b'"k":1,' * 1000 + b'"k":2}',
])


EMITTER = {"type": "user", "id": PARTICIPANT}


def _skeleton(method: str, template: str, text: str, value: Any, count: int) -> Any:
    """A body of the route's own shape with one hostile leaf (so that it reaches the masker),
    or None for a route without one here."""
    if template.endswith("/memories/remember"):
        return {"namespace": "notes", "text": text}
    if template.endswith(("/memories/recall", "/memories/search/")):
        return {"query": text}
    if template.endswith("/events"):
        one = {"body": value, "emitter": EMITTER, "eventType": "message"}
        return one if count == 1 else {"events": [one] * count}
    if template.endswith("/events/{sequenceId}"):
        return {"body": value}
    if template.endswith(("/sessions", "/sessions/{sessionId}")):
        return ({"participants": [PARTICIPANT], "description": text} if method == "POST"
                else {"description": text})
    if template == "/memory/spaces":
        return {"description": text}
    if template.endswith("/memories/add/"):
        return {"messages": [{"role": "user", "content": text}] * count, "user_id": "alex"}
    if template.endswith("/memories/{memoryId}/"):
        return {"text": text}
    return None


@st.composite
def bodies(draw: st.DrawFn, keys: list[str], method: str = "", template: str = "",
           ) -> bytes | None:
    if template and draw(st.integers(0, 3)):  # mostly the route's own shape, when it has one
        skeleton = _skeleton(method, template, draw(strings), draw(json_values),
                             draw(st.sampled_from([1, 2, 50])))
        if skeleton is not None:
            return json.dumps(skeleton).encode(errors="surrogatepass")
    kind = draw(st.sampled_from(["none", "shaped", "value", "raw"]))
    if kind == "none":
        return None
    if kind == "raw":
        return draw(raw_bodies)
    if kind == "value":
        return json.dumps(draw(json_values)).encode(errors="surrogatepass")
    shaped = draw(st.dictionaries(st.sampled_from(keys), json_values, min_size=1, max_size=5))
    return json.dumps(shaped).encode(errors="surrogatepass")


path_values = st.one_of(st.text(max_size=30), st.sampled_from(
    ["a" * 2000, "1" * 2000, " " * 200, "..", "%2e%2e", "0", "-1", "99999999999999999999"]))


def _breaks(method: str, template: str) -> bool:
    """Would this route, with the fixture's own ids, take away what the other examples use
    (delete the space, turn a flag off, demote the owner)? Those get hostile ids only."""
    return method == "DELETE" or template.endswith(("/members/{memberId}", "/settings",
                                                    "/shares/{memberId}"))


@st.composite
def requests(draw: st.DrawFn, running: Running, *, valid: bool = False,
             ) -> tuple[str, str, dict[str, str], bytes | None]:
    """A request to any route; `valid`: to a route that takes a body, with valid ids and the
    credential it needs (only the body is hostile)."""
    routes = ([(m, p) for m, p in running.routes if m != "GET" and not _breaks(m, p)]
              if valid else running.routes)
    method, template = draw(st.sampled_from(routes))

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if (name in running.known and not _breaks(method, template)
                and (valid or draw(st.booleans()))):  # valid ids, or half the time
            return running.known[name]
        return quote(draw(path_values), safe="")

    path = re.sub(r"\{([^}]+)\}", value, template)
    query = draw(st.dictionaries(st.sampled_from(
        ["lastN", "limit", "cursor", "namespace", "page", "page_size", "filters", "user_id"]),
        path_values, max_size=2))
    if query:
        path += "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    headers = {"Content-Type": "application/json"}
    if valid:
        token: str | None = running.tokens[
            -1 if template.startswith("/api/agent") else -3 if "/admin/" in template else -2]
    else:
        token = draw(st.sampled_from(running.tokens[-3:]) if draw(st.booleans())
                     else st.sampled_from(running.tokens))
    if token is not None:
        headers["Authorization"] = f"{draw(st.sampled_from(['Bearer', 'Token']))} {token}"
    if draw(st.booleans()):
        headers["If-Match"] = draw(st.sampled_from(['"1"', "W/\"1\"", "*", "x" * 1000, "0"]))
    return method, path, headers, draw(bodies(running.body_keys, method,
                                              template if valid else ""))


def _error_shape(response: httpx.Response) -> None:
    body = response.json()
    error = body["error"]
    assert isinstance(error["code"], str) and error["code"].isupper(), body
    assert isinstance(error["message"], str), body
    assert isinstance(error.get("details", {}), dict), body


HOSTILE = settings(deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(HOSTILE, max_examples=400)
@given(data=st.data())
def test_no_route_answers_a_hostile_request_with_a_5xx_the_wrong_shape_or_seconds_of_cpu(
        running: Running, data: st.DataObject) -> None:
    _send_and_check(running, *data.draw(requests(running)))


@settings(HOSTILE, max_examples=200)
@given(data=st.data())
def test_no_hostile_body_sent_with_valid_ids_and_credentials_gets_a_5xx_or_seconds_of_cpu(
        running: Running, data: st.DataObject) -> None:
    _send_and_check(running, *data.draw(requests(running, valid=True)))


def _send_and_check(running: Running, method: str, path: str, headers: dict[str, str],
                    body: bytes | None) -> None:
    with httpx.Client(base_url=running.base_url, timeout=WALL_LIMIT_S) as http:
        cpu, wall = time.process_time(), time.monotonic()
        response = http.request(method, path, headers=headers, content=body)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    where = (method, path[:200], len(body or b""), response.status_code, response.text[:300])
    event(f"{response.status_code // 100}xx")
    assert response.status_code < 500, where
    if response.status_code >= 400:
        _error_shape(response)
    assert cpu < CPU_LIMIT_S, (cpu, wall, where)

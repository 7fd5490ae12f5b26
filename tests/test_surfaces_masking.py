"""Masking and sizes on every surface (SPEC §3.2, §4.1, §4.2, §4.4; #28 findings 6, 7, 8), on
the real app: sizes checked before masking, masking off the event loop, every free-text field
masked or refused, and a space's LLM reached only at an origin the operator allows."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from memgate.contracts.sessions import EVENT_BODY_MAX_BYTES
from tests.conftest import Llm, Memgate
from tests.test_sessions import PARTICIPANT, Space, call, new_session, new_space, ok, refused


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


def _space(space: Space) -> str:
    return f"/memory/spaces/{space.space_id}"


__all__ = ["ok"]

"""mem0's search threshold, batch_update and batch_delete (SPEC §4.4), with the real, unmodified
`mem0ai` client against a running memgate."""

from __future__ import annotations

import os
import tempfile

# Before mem0 is imported: no analytics, and its config file in a temporary folder.
os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-"))

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from mem0.exceptions import (
    AuthenticationError, MemoryNotFoundError, RateLimitError, ValidationError,
)

from tests.conftest import Memgate, run_memgate
from tests.test_mem0 import EMAIL, new_space, texts


@pytest.fixture
async def memgate(tmp_path: Path) -> AsyncIterator[Memgate]:
    async with AsyncExitStack() as stack:
        yield await run_memgate(tmp_path, stack)


async def test_search_leaves_out_results_scored_below_the_threshold(memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    for text in ["green tea every morning", "green tea with mint", "a bicycle ride to work"]:
        await asyncio.to_thread(client.add, text, user_id="alex")
    everything = (await asyncio.to_thread(client.search, "green tea mint"))["results"]
    scores = sorted({r["score"] for r in everything}, reverse=True)
    assert len(scores) >= 2

    best = await asyncio.to_thread(client.search, "green tea mint", threshold=scores[0])
    assert [r["score"] for r in best["results"]] == [
        r["score"] for r in everything if r["score"] >= scores[0]]
    assert len(best["results"]) < len(everything)
    above = await asyncio.to_thread(client.search, "green tea mint", threshold=scores[0] * 2)
    assert above["results"] == []
    zero = await asyncio.to_thread(client.search, "green tea mint", threshold=0)
    assert len(zero["results"]) == len(everything)
    with pytest.raises(ValidationError):
        await asyncio.to_thread(client.search, "green tea", threshold=-1)


async def added(client: Any, *items: str) -> list[str]:
    ids = []
    for text in items:
        [memory] = (await asyncio.to_thread(client.add, text, user_id="alex"))["results"]
        ids.append(memory["id"])
    return ids


async def test_batch_update_masks_each_text_and_keeps_the_history(memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    tea, bike, city = await added(client, "I like tea", "I ride a bike", "I live in Haifa")
    answer = await asyncio.to_thread(client.batch_update, [
        {"memory_id": tea, "text": f"I like green tea, mail {EMAIL}"},
        {"memory_id": bike, "text": "I ride an e-bike"},
        {"memory_id": city, "metadata": {"source": "chat"}}])
    assert "3" in answer["message"]
    assert texts((await asyncio.to_thread(client.get_all))["results"]) == [
        "I like green tea, mail [EMAIL]", "I live in Haifa", "I ride an e-bike"]
    history = await asyncio.to_thread(client.history, tea)
    assert [h["event"] for h in history] == ["ADD", "UPDATE"]


async def test_a_bad_batch_update_changes_nothing(memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    tea, bike = await added(client, "I like tea", "I ride a bike")
    unchanged = ["I like tea", "I ride a bike"]
    bad: list[tuple[type[Exception], list[dict[str, Any]]]] = [
        (MemoryNotFoundError, [{"memory_id": tea, "text": "changed"},
                               {"memory_id": "0123456789abcdef", "text": "changed"}]),
        (ValidationError, [{"memory_id": tea, "text": "changed"},
                           {"memory_id": bike, "text": "x" * 1001}]),
        (ValidationError, [{"memory_id": tea, "text": "changed"},
                           {"memory_id": bike, "text": EMAIL}]),  # nothing left once masked
        (ValidationError, [{"memory_id": tea, "text": "changed"},
                           {"memory_id": tea, "text": "again"}]),
        (ValidationError, [{"memory_id": tea, "text": "changed"}] * 1001),
        (ValidationError, []),
    ]
    for error, memories in bad:
        with pytest.raises(error):
            await asyncio.to_thread(client.batch_update, memories)
        assert texts((await asyncio.to_thread(client.get_all))["results"]) == unchanged

    consumer = await space.member("consumer")
    reader = await space.client(consumer.token)
    with pytest.raises(AuthenticationError):
        await asyncio.to_thread(reader.batch_update, [{"memory_id": tea, "text": "changed"}])
    with pytest.raises(AuthenticationError):
        await asyncio.to_thread(reader.batch_delete, [{"memory_id": tea}])
    assert texts((await asyncio.to_thread(client.get_all))["results"]) == unchanged


async def test_a_batch_update_over_the_rate_limit_is_taken_back_whole(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, limit_remembers_per_hour=3)
        space = await new_space(memgate)
        client = await space.client()
        tea, bike = await added(client, "I like tea", "I ride a bike")
        with pytest.raises(RateLimitError):  # the third remember is taken, the fourth not
            await asyncio.to_thread(client.batch_update, [
                {"memory_id": tea, "text": "I like coffee"},
                {"memory_id": bike, "text": "I walk"}])
        assert texts((await asyncio.to_thread(client.get_all))["results"]) == [
            "I like tea", "I ride a bike"]
        assert [len(await asyncio.to_thread(client.history, m)) for m in (tea, bike)] == [1, 1]


async def test_batch_delete_deletes_every_memory_named_or_none(memgate: Memgate) -> None:
    space = await new_space(memgate)
    client = await space.client()
    tea, bike, city = await added(client, "I like tea", "I ride a bike", "I live in Haifa")
    with pytest.raises(MemoryNotFoundError):
        await asyncio.to_thread(client.batch_delete, [{"memory_id": tea},
                                                      {"memory_id": "0123456789abcdef"}])
    with pytest.raises(ValidationError):
        await asyncio.to_thread(client.batch_delete, [{"memory_id": tea}] * 1001)
    assert (await asyncio.to_thread(client.get_all))["count"] == 3

    answer = await asyncio.to_thread(client.batch_delete, [{"memory_id": tea},
                                                           {"memory_id": bike}])
    assert "2" in answer["message"]
    assert texts((await asyncio.to_thread(client.get_all))["results"]) == ["I live in Haifa"]
    for gone in (tea, bike):
        with pytest.raises(MemoryNotFoundError):
            await asyncio.to_thread(client.history, gone)
    assert (await asyncio.to_thread(client.get, city))["memory"] == "I live in Haifa"


async def test_a_thousand_memories_are_one_batch(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        memgate = await run_memgate(tmp_path, stack, limit_remembers_per_hour=3000)
        space = await new_space(memgate)
        client = await space.client()
        ids: list[str] = []
        for start in range(0, 1000, 200):
            ids += [r["id"] for r in (await asyncio.to_thread(client.add, [
                {"role": "user", "content": f"fact number {i}"}
                for i in range(start, start + 200)], user_id="alex"))["results"]]
        await asyncio.to_thread(client.batch_update, [
            {"memory_id": m, "text": f"updated fact {i}"} for i, m in enumerate(ids)])
        assert (await asyncio.to_thread(client.get, ids[999]))["memory"] == "updated fact 999"
        await asyncio.to_thread(client.batch_delete, [{"memory_id": m} for m in ids])
        assert (await asyncio.to_thread(client.get_all))["count"] == 0

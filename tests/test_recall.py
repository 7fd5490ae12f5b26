"""Fused recall (SPEC §3.5) on real components: nats-server, DuckDB, Tantivy, the ONNX model."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from actors.fusion import rrf
from tests.conftest import Memgate


def test_rrf_adds_reciprocal_ranks() -> None:
    fused = rrf({"bm25": ["a", "b", "c"], "cosine": ["b", "a"], "entity": []}, k=60)
    by_id = {f.memory_id: f for f in fused}
    assert by_id["a"].score == pytest.approx(1 / 61 + 1 / 62)
    assert by_id["b"].score == pytest.approx(1 / 62 + 1 / 61)
    assert by_id["c"].score == pytest.approx(1 / 63)
    assert by_id["c"].ranks == {"bm25": 3}
    assert by_id["b"].ranks == {"bm25": 2, "cosine": 1}
    assert [f.memory_id for f in fused][-1] == "c"
    assert rrf({"bm25": ["x"]}, k=1)[0].score == pytest.approx(0.5)


async def agent_for(memgate: Memgate, transport: str):  # type: ignore[no-untyped-def]
    owner = await memgate.workspace()
    return await memgate.agent(transport, await memgate.credential(owner))


async def test_a_memory_is_recallable_by_its_words_as_soon_as_remember_returns(memgate: Memgate, transport: str) -> None:
    agent = await agent_for(memgate, transport)
    await agent.remember("team", "Team Orion's staging database is Postgres 15")
    await agent.remember("prefs", "The user likes green tea")
    remembered = await agent.remember("prefs", "The user deploys on Fridays after lunch")
    result = await agent.recall("deploys fridays")
    top = result.memories[0]
    assert top.memory_id == remembered.memory_id
    assert top.ranks.bm25 == 1
    assert (top.type, top.evidence, top.trust) == ("memory", False, "untrusted")
    assert top.score == pytest.approx(sum(1 / (60 + r) for r in (top.ranks.bm25, top.ranks.cosine) if r))
    await agent.close()


async def test_meaning_matches_without_shared_words(memgate: Memgate, transport: str) -> None:
    agent = await agent_for(memgate, transport)
    answer = await agent.remember("prefs", "The user deploys on Fridays")
    await agent.remember("prefs", "The staging cluster runs Kubernetes 1.30")
    await agent.remember("prefs", "Lunch is usually sushi")
    for _ in range(100):  # the embedder catches up from the events stream
        result = await agent.recall("which weekday do releases ship?")
        if result.memories and result.memories[0].ranks.cosine is not None:
            break
        await asyncio.sleep(0.05)
    assert result.memories[0].memory_id == answer.memory_id
    assert result.memories[0].ranks.cosine == 1 and result.memories[0].ranks.bm25 is None
    assert result.degraded == []
    await agent.close()


async def test_japanese_is_matched_inside_unspaced_text(memgate: Memgate, transport: str) -> None:
    agent = await agent_for(memgate, transport)
    meeting = await agent.remember("schedule", "毎週月曜日の朝に定例会議がある")
    await agent.remember("customer", "顧客は日本語でのサポートを希望している")
    result = await agent.recall("会議")
    assert [m.memory_id for m in result.memories if m.ranks.bm25] == [meeting.memory_id]
    wide = await agent.recall("ｻﾎﾟｰﾄ")  # half-width katakana finds full-width
    assert wide.memories[0].text.startswith("顧客")
    assert wide.memories[0].ranks.bm25 == 1
    await agent.close()


async def test_recall_as_of_and_namespace_and_limit(memgate: Memgate, transport: str) -> None:
    agent = await agent_for(memgate, transport)
    await agent.remember("prefs", "deploys on Fridays", key="deploy")
    between = datetime.now(UTC)
    await asyncio.sleep(0.01)
    await agent.remember("prefs", "deploys on Thursdays", key="deploy")
    for i in range(12):
        await agent.remember("other", f"deploy note {i}")
    then = await agent.recall("deploys", as_of=between)
    assert [m.text for m in then.memories] == ["deploys on Fridays"]
    now = await agent.recall("deploys", namespace="prefs")
    assert [m.text for m in now.memories] == ["deploys on Thursdays"]
    assert len((await agent.recall("deploy")).memories) == 10
    assert len((await agent.recall("deploy", limit=3)).memories) == 3
    await agent.close()

"""Recall on the in-memory broker: RRF over BM25, cosine and entities; the cosine deadline;
hidden memories never take a place; storage reads only the fused head."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from memgate.actors.recall import RecallActor
from memgate.bus import subjects
from memgate.contracts import Memory, RecallResult
from memgate.contracts.internal import Owner, RecallQuery
from memgate.contracts.registry import Citation, Verification
from memgate.policy.fusion import rrf
from memgate.policy.sequence import Window
from tests.fakes import FakeEmbedder, FakeRankers, FakeRegistry, FakeStorage, Served, served

pytestmark = pytest.mark.unit

K = 60
OWNER = Owner(tenant="ws", subject_id="member")
CITATION = Citation(passage_id="p", document_id="d", version=1, sha256="0" * 64)


def window(*ids: str, cited: frozenset[str] = frozenset()) -> list[Memory]:
    """Memories newest first, as storage holds them."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return [Memory(memory_id=i, namespace="n", text=f"text of {i}",
                   created_at=start - timedelta(minutes=n),
                   citations=[CITATION] if i in cited else [])
            for n, i in enumerate(ids)]


@dataclass
class World:
    bus: Served
    storage: FakeStorage
    registry: FakeRegistry
    rankers: FakeRankers

    async def recall(self, query: str = "what", limit: int = 10) -> RecallResult:
        return await self.bus.call(subjects.recall_internal(),
                                   RecallQuery(owner=OWNER, query=query, limit=limit),
                                   RecallResult)


@asynccontextmanager
async def recall_on(embedder: FakeEmbedder, *, cosine_deadline_ms: int = 5_000,
                    bm25_deadline_ms: int = 5_000,
                    window: int | None = None, sequence: Window | None = None,
                    weights: dict[str, float] | None = None) -> AsyncIterator[World]:
    storage, registry, rankers = FakeStorage(), FakeRegistry(), FakeRankers()
    actor = RecallActor(storage=storage, registry=registry, rankers=rankers,
                        embedder=lambda: embedder, window=window, rrf_k=K,
                        cosine_deadline_ms=cosine_deadline_ms, bm25_deadline_ms=bm25_deadline_ms,
                        batch=8, depth_bm25=3, sequence=sequence, weights=weights)
    async with served(actor) as bus:
        yield World(bus, storage, registry, rankers)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with recall_on(FakeEmbedder()) as world:
        yield world


async def test_recall_fuses_the_channels_by_reciprocal_rank(world: World) -> None:
    world.storage.memories = window("a", "b", "c", "d", cited=frozenset({"c"}))
    world.rankers.bm25_ids = ["b", "a"]
    world.rankers.cosine_ids = ["a", "c", "b"]
    world.registry.verdict = Verification(entity_matches={"c": 2})
    result = await world.recall()
    expected = rrf({"bm25": ["b", "a"], "cosine": ["a", "c", "b"], "entity": ["c"]}, K)
    assert [m.memory_id for m in result.memories] == [f.memory_id for f in expected]
    assert [m.score for m in result.memories] == pytest.approx([f.score for f in expected])
    first = result.memories[0]
    assert (first.memory_id, first.ranks.bm25, first.ranks.cosine, first.ranks.entity) == \
        ("a", 2, 1, None)
    assert result.degraded == []
    assert world.storage.scopes[-1].window is None  # every memory, not the newest 300
    assert {r.min_seq for r in world.rankers.requests} == {4}  # read-your-writes


async def test_equal_scores_go_to_the_newer_memory(world: World) -> None:
    world.storage.memories = window("newer", "older")
    world.rankers.bm25_ids = ["older"]
    world.rankers.cosine_ids = ["newer"]
    result = await world.recall()
    assert [m.memory_id for m in result.memories] == ["newer", "older"]


async def test_the_limit_cuts_the_fused_list(world: World) -> None:
    world.storage.memories = window("a", "b", "c")
    world.rankers.bm25_ids = ["c", "b", "a"]
    assert [m.memory_id for m in (await world.recall(limit=2)).memories] == ["c", "b"]


async def test_hidden_memories_never_take_a_place(world: World) -> None:
    world.storage.memories = window("hidden", "a", "b", cited=frozenset({"hidden", "a"}))
    world.rankers.bm25_ids = ["hidden", "a", "b"]
    world.rankers.cosine_ids = ["hidden", "b"]
    world.registry.verdict = Verification(hidden=["hidden"], changed=["a"],
                                          entity_matches={"hidden": 3})
    result = await world.recall(limit=2)
    assert [m.memory_id for m in result.memories] == ["b", "a"]
    assert [m.source_state for m in result.memories] == ["current", "changed"]
    assert result.hidden == 1
    assert all("hidden" in r.exclude for r in world.rankers.requests)
    assert set(world.registry.verified[-1]) == {"hidden", "a"}


async def test_everything_hidden_answers_nothing_without_ranking(world: World) -> None:
    world.storage.memories = window("a", cited=frozenset({"a"}))
    world.registry.verdict = Verification(hidden=["a"])
    result = await world.recall()
    assert (result.memories, result.hidden) == ([], 1)
    assert world.rankers.requests == []


async def test_a_slow_embedder_degrades_cosine_and_bm25_still_answers() -> None:
    gate = threading.Event()
    embedder = FakeEmbedder(gate)
    gate.set()  # the warm-up at start passes; queries after it wait for the gate
    try:
        async with recall_on(embedder, cosine_deadline_ms=50) as world:
            gate.clear()
            world.storage.memories = window("a", "b")
            world.rankers.bm25_ids = ["b"]
            world.rankers.cosine_ids = ["a", "b"]
            result = await world.recall()
            assert result.degraded == ["cosine"]
            assert [(m.memory_id, m.ranks.cosine) for m in result.memories] == [("b", None)]
            gate.set()  # let the model thread finish before the actor stops
    finally:
        gate.set()


async def test_a_late_indexer_degrades_bm25_without_holding_up_the_answer() -> None:
    async with recall_on(FakeEmbedder(), bm25_deadline_ms=50) as world:
        world.storage.memories = window("a", "b")
        world.rankers.bm25_ids = ["b"]
        world.rankers.cosine_ids = ["a", "b"]
        world.rankers.bm25_late_s = 5.0
        started = time.monotonic()
        result = await world.recall()
        assert time.monotonic() - started < 2.0  # the deadline, not the indexer's answer
        assert result.degraded == ["bm25"]
        assert [(m.memory_id, m.ranks.bm25, m.ranks.cosine) for m in result.memories] == [
            ("a", None, 1), ("b", None, 2)]


async def test_storage_reads_only_the_rows_of_the_fused_head(world: World) -> None:
    ids = [f"m{i}" for i in range(40)]
    world.storage.memories = window(*ids)
    world.rankers.bm25_ids = ids
    result = await world.recall(limit=3)
    assert [m.memory_id for m in result.memories] == ["m0", "m1", "m2"]
    assert len(world.storage.rows_asked) == 1
    assert len(world.storage.rows_asked[0]) < 15


async def test_a_memory_gone_from_storage_gives_its_place_to_the_next(world: World) -> None:
    world.storage.memories = window(*[f"m{i}" for i in range(10)])
    gone = [f"gone{i}" for i in range(20)]  # ranked by a channel, deleted since
    world.rankers.bm25_ids = [*gone, "m7", "m8"]
    result = await world.recall(limit=2)
    assert [m.memory_id for m in result.memories] == ["m7", "m8"]


async def test_the_operators_window_reaches_every_channel() -> None:
    async with recall_on(FakeEmbedder(), window=50) as world:
        world.storage.memories = window("a")
        world.rankers.bm25_ids = ["a"]
        await world.recall()
        assert world.storage.scopes[-1].window == 50
        assert {r.filters.window for r in world.rankers.requests} == {50}


async def test_the_sequence_window_draws_in_the_neighbours_of_the_best_match() -> None:
    sequence = Window(width=1, decay=1.0, weight=0.5, head=2)
    async with recall_on(FakeEmbedder(), sequence=sequence) as world:
        world.storage.memories = window("a", "b", "c", "d", "e", "f", cited=frozenset({"b"}))
        world.rankers.sequence = ["a", "b", "c", "d", "e", "f"]  # remembered in this order
        world.rankers.bm25_ids = ["c"]
        world.rankers.cosine_ids = ["c", "f", "d", "e"]
        world.registry.verdict = Verification(hidden=["b"])
        result = await world.recall(limit=4)
        # b is hidden: a takes its place as c's neighbour before it; f, a cosine match only,
        # lends nothing to e; d gains but stays below c, which lent to it
        assert [m.memory_id for m in result.memories] == ["c", "d", "a", "f"]
        lent = 0.5 * 2 / (K + 1)
        assert [m.score for m in result.memories] == pytest.approx(
            [2 / (K + 1), 1 / (K + 3) + lent, lent, 1 / (K + 2)])
        assert result.memories[2].ranks.model_dump() == {"bm25": None, "cosine": None,
                                                         "entity": None, "conversation": None,
                                                         "context": None, "smoothed": None}
        assert sorted(r.neighbours for r in world.rankers.requests) == [0, 1]  # BM25 asks


async def test_channel_weights_and_the_bm25_depth_reach_the_fusion() -> None:
    async with recall_on(FakeEmbedder(), weights={"bm25": 3.0}) as world:
        world.storage.memories = window("a", "b", "c", "d", "e")
        world.rankers.bm25_ids = ["b", "a"]
        world.rankers.cosine_ids = ["c"]
        result = await world.recall()
        assert [m.memory_id for m in result.memories] == ["b", "a", "c"]
        assert result.memories[0].score == pytest.approx(3 / (K + 1))
        assert {r.depth for r in world.rankers.requests} == {3, 100}

"""The indexer on the in-memory broker (a real Tantivy index in a temp dir, storage faked):
events feed the index, deletions leave it, and rank reads its own writes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from memgate.actors.indexer import IndexerActor
from memgate.bus import subjects
from memgate.contracts.events import MemoriesDeleted, MemoryStored
from memgate.contracts.internal import Owner, Ranking, RankRequest
from tests.fakes import FakeBus, Served, served, texts_route

pytestmark = pytest.mark.unit

OWNER = Owner(tenant="ws", subject_id="member")
DURABLE = "indexer-p0"


@dataclass
class World:
    bus: Served
    fake: FakeBus
    texts: dict[str, str]

    async def rank(self, query: str, ids: list[str]) -> list[str]:
        return (await self.bus.call(subjects.index("p0", "rank"), RankRequest(
            owner=OWNER, query=query, memory_ids=ids), Ranking)).memory_ids

    async def stored(self, *ids: str) -> None:
        await self.fake.deliver(DURABLE, [MemoryStored(partition="p0", owner=OWNER, memory_id=i,
                                                       seq=n).to_json()
                                          for n, i in enumerate(ids, start=1)])


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    texts = {"a": "the quarterly budget review", "b": "lunch with the design team",
             "c": "budget for the design offsite"}
    fake = FakeBus({subjects.store("p0", "texts"): texts_route(texts)})
    actor = IndexerActor(partition="p0", root=tmp_path / "text-index", bus=fake)
    async with served(actor) as bus:
        yield World(bus, fake, texts)


async def test_indexed_memories_rank_by_bm25_among_the_candidates(world: World) -> None:
    await world.stored("a", "b", "c")
    assert set(await world.rank("budget", ["a", "b", "c"])) == {"a", "c"}
    assert await world.rank("budget", ["b", "c"]) == ["c"]  # candidates only


async def test_rank_indexes_candidates_the_events_have_not_brought_yet(world: World) -> None:
    assert await world.rank("lunch", ["a", "b"]) == ["b"]


async def test_a_deleted_memory_leaves_the_index(world: World) -> None:
    await world.stored("a", "c")
    del world.texts["a"]  # storage no longer has it
    await world.fake.deliver(DURABLE, [MemoriesDeleted(partition="p0", owner=OWNER,
                                                       memory_ids=["a"]).to_json()])
    assert await world.rank("budget", ["c"]) == ["c"]
    assert "a" not in await world.rank("quarterly budget", ["c"])

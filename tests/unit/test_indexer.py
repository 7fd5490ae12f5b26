"""The indexer on the in-memory broker (a real Tantivy index in a temp dir, storage faked):
events feed the index, deletions leave it, rank filters in its own index and reads its own
writes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from memgate.actors.indexer import IndexerActor
from memgate.bus import subjects
from memgate.contracts.events import MemoriesDeleted, MemoryStored
from memgate.contracts.internal import Owner, Ranking, RankRequest, RecallFilters
from tests.fakes import FakeBus, Served, catalog_route, served, texts_route

pytestmark = pytest.mark.unit

OWNER = Owner(tenant="ws", subject_id="member")
DURABLE = "indexer-p0"


@dataclass
class World:
    bus: Served
    fake: FakeBus
    texts: dict[str, str]

    async def rank(self, query: str, *, min_seq: int = 0, exclude: tuple[str, ...] = (),
                   namespace: str | None = None) -> list[str]:
        return (await self.bus.call(subjects.index("p0", "rank"), RankRequest(
            filters=RecallFilters(owner=OWNER, namespace=namespace), query=query, depth=10,
            min_seq=min_seq, exclude=list(exclude)), Ranking)).memory_ids

    async def stored(self, *ids: str) -> None:
        await self.fake.deliver(DURABLE, [MemoryStored(partition="p0", owner=OWNER, memory_id=i,
                                                       seq=n).to_json()
                                          for n, i in enumerate(ids, start=1)])


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    texts = {"a": "the quarterly budget review", "b": "lunch with the design team",
             "c": "budget for the design offsite"}
    fake = FakeBus({subjects.store("p0", "texts"): texts_route(texts),
                    subjects.store("p0", "catalog"): catalog_route(texts)})
    actor = IndexerActor(partition="p0", root=tmp_path / "text-index", bus=fake)
    async with served(actor) as bus:
        yield World(bus, fake, texts)


async def test_indexed_memories_rank_by_bm25_under_the_filters(world: World) -> None:
    await world.stored("a", "b", "c")
    assert set(await world.rank("budget")) == {"a", "c"}
    assert await world.rank("budget", exclude=("a",)) == ["c"]  # hidden: never a place
    assert await world.rank("budget", namespace="elsewhere") == []


async def test_rank_catches_up_to_the_newest_seq_before_searching(world: World) -> None:
    assert await world.rank("lunch", min_seq=3) == ["b"]  # no event has arrived yet


async def test_a_redelivered_event_asks_storage_nothing(world: World) -> None:
    await world.stored("a", "b", "c")
    asked = len(world.fake.asked)
    await world.stored("a", "b", "c")
    assert len(world.fake.asked) == asked


async def test_a_deleted_memory_leaves_the_index(world: World) -> None:
    await world.stored("a", "c")
    del world.texts["a"]  # storage no longer has it
    await world.fake.deliver(DURABLE, [MemoriesDeleted(partition="p0", owner=OWNER,
                                                       memory_ids=["a"]).to_json()])
    assert await world.rank("budget") == ["c"]
    assert "a" not in await world.rank("quarterly budget")


async def test_rank_reports_the_neighbours_of_its_matches_when_asked(world: World) -> None:
    await world.stored("a", "b", "c")
    ranking = await world.bus.call(subjects.index("p0", "rank"), RankRequest(
        filters=RecallFilters(owner=OWNER), query="lunch", depth=10, neighbours=2,
        exclude=["c"]), Ranking)
    assert ranking.memory_ids == ["b"]
    assert ranking.neighbours["b"].model_dump() == {"before": ["a"], "after": []}  # c hidden


async def test_a_new_memory_of_a_loaded_owner_is_indexed_after_one_storage_request(
    world: World,
) -> None:
    """Its text comes with its catalog row: no second request for it."""
    await world.stored("a", "b", "c")  # the owner's catalog is loaded
    world.texts["d"] = "zanzibar harbour trip"
    world.fake.asked.clear()
    await world.fake.deliver(DURABLE, [MemoryStored(partition="p0", owner=OWNER, memory_id="d",
                                                    seq=4).to_json()])
    assert [subject for subject, _ in world.fake.asked] == [subjects.store("p0", "catalog")]
    assert await world.rank("zanzibar harbour") == ["d"]

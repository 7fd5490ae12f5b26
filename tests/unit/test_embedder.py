"""The embedder on the in-memory broker (real vector file in a temp dir; a fake model):
stored memories get vectors once, deleted ones lose them, rank orders by cosine."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from memgate.actors import embedder as embedder_module
from memgate.actors.embedder import URGENT_MAX, EmbedderActor
from memgate.bus import subjects
from memgate.contracts.errors import ErrorCode, MemgateError
from memgate.contracts.events import MemoriesDeleted, MemoryStored
from memgate.contracts.internal import Owner, Ranking, RankRequest, RecallFilters
from memgate.runtime.actor import BACKGROUND_NICE
from tests.conftest import eventually
from tests.fakes import FakeBus, FakeEmbedder, Served, catalog_route, served, texts_route

pytestmark = pytest.mark.unit

OWNER = Owner(tenant="ws", subject_id="member")
OTHER = Owner(tenant="ws", subject_id="someone-else")
DURABLE = "embedder-p0"


@dataclass
class World:
    bus: Served
    fake: FakeBus
    model: FakeEmbedder
    texts: dict[str, str]

    async def rank(self, query: str, *, min_seq: int = 0, exclude: tuple[str, ...] = (),
                   namespace: str | None = None) -> list[str]:
        return (await self.bus.call(subjects.embed("p0", "rank"), RankRequest(
            filters=RecallFilters(owner=OWNER, namespace=namespace), query=query, depth=10,
            min_seq=min_seq, exclude=list(exclude)), Ranking)).memory_ids

    async def stored(self, *ids: str) -> None:
        await self.fake.deliver(DURABLE, [MemoryStored(partition="p0", owner=OWNER, memory_id=i,
                                                       seq=n).to_json()
                                          for n, i in enumerate(ids, start=1)])


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    model = FakeEmbedder()
    # The actor loads its model by path; the fake stands in for the ONNX session.
    monkeypatch.setattr(embedder_module, "OnnxEmbedder", lambda *_, **__: model)
    texts = {"a": "budget review numbers", "b": "team lunch friday", "c": "budget lunch"}
    # storage holds what the test puts in `texts`; the catalog route numbers them in order
    fake = FakeBus({subjects.store("p0", "texts"): texts_route(texts),
                    subjects.store("p0", "catalog"): catalog_route(texts)})
    actor = EmbedderActor(partition="p0", path=tmp_path / "vectors.duckdb", model=Path("m"),
                          tokenizer=Path("t"), bus=fake, batch=4)
    async with served(actor) as bus:
        yield World(bus, fake, model, texts)


async def test_stored_memories_rank_by_cosine_similarity(world: World) -> None:
    await world.stored("a", "b", "c")
    assert (await world.rank("budget review numbers"))[0] == "a"
    assert (await world.rank("team lunch friday"))[0] == "b"
    assert "a" not in await world.rank("budget review numbers", exclude=("a",))
    assert await world.rank("budget", namespace="elsewhere") == []


@pytest.mark.skipif(sys.platform != "linux", reason="threads have priorities of their own on Linux")
async def test_memories_are_embedded_at_a_lower_priority_than_commands_are_served(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    niceness: list[int] = []
    embed = world.model.embed

    def embed_noting_priority(texts: list[str]) -> np.ndarray:
        niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return embed(texts)

    monkeypatch.setattr(world.model, "embed", embed_noting_priority)
    await world.stored("a")
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert niceness and niceness[0] == min(here + BACKGROUND_NICE, 19)


async def test_a_memory_whose_event_has_not_come_is_embedded_when_ranked_and_only_once(
        world: World) -> None:
    del world.texts["b"], world.texts["c"]
    await world.stored("a")
    world.texts["b"] = "budget lunch"  # remembered; its event has not come yet
    assert sorted(await world.rank("budget", min_seq=2)) == ["a", "b"]
    embedded = sum(len(call) for call in world.model.calls)
    await world.stored("a", "b")
    assert sum(len(call) for call in world.model.calls) == embedded


async def test_a_rank_does_not_wait_for_a_backlog_it_says_the_channel_is_missing(
        world: World) -> None:
    world.texts.update({f"m{i}": f"budget note {i}" for i in range(URGENT_MAX + 1)})
    with pytest.raises(MemgateError) as refused:  # the recall answers `degraded: ["cosine"]`
        await world.rank("budget", min_seq=len(world.texts))
    assert refused.value.code == ErrorCode.UNAVAILABLE
    assert world.model.calls == [["warm up"]]  # the backlog is left to the events


async def test_a_backlog_whose_events_are_coming_is_left_to_them_and_embedded_once(
        world: World) -> None:
    """A rank that finds a backlog while its events wait in the stream does not embed it in
    the background too: at saturation both embedded the same versions (bench.compare: 40%
    more CPU per remember, vectors a second later)."""
    backlog = {f"m{i}": f"budget note {i}" for i in range(URGENT_MAX + 1)}
    world.texts.update(backlog)
    world.fake.consumers[DURABLE].pending = len(world.texts)  # their events wait
    with pytest.raises(MemgateError):
        await world.rank("budget", min_seq=len(world.texts))
    await asyncio.sleep(0.2)
    assert world.model.calls == [["warm up"]]
    world.fake.consumers[DURABLE].pending = 0
    await world.stored(*world.texts)
    embedded = [text for call in world.model.calls[1:] for text in call]
    assert sorted(embedded) == sorted(world.texts.values())


async def test_a_backlog_whose_events_have_passed_is_embedded_while_others_events_wait(
        world: World) -> None:
    """An owner whose vectors were lost (their events applied long ago) is not left degraded
    while other members' remembers keep the stream busy."""
    world.texts.update({f"m{i}": f"budget note {i}" for i in range(3 * URGENT_MAX)})
    newer = MemoryStored(partition="p0", owner=OTHER, memory_id="c", seq=len(world.texts))
    await world.fake.deliver(DURABLE, [newer.to_json()])  # another member's, newer than all
    world.fake.consumers[DURABLE].pending = 2  # and more waiting: the stream is never idle

    async def ranked() -> bool:
        try:
            return bool(await world.rank("budget", min_seq=len(world.texts)))
        except MemgateError:  # degraded: still embedding
            return False

    await eventually(ranked, timeout=5)


async def test_a_backlog_whose_events_are_not_published_yet_is_left_to_them(
        world: World) -> None:
    """Few events wait, but the versions lacking vectors are newer than any event applied:
    their events are on their way (the relay publishes after the commit), so nothing embeds
    them in the background too (bench.compare: 5.9 → 7.5 ms of CPU per remember)."""
    world.texts.update({f"m{i}": f"budget note {i}" for i in range(3 * URGENT_MAX)})
    world.fake.consumers[DURABLE].pending = 1
    with pytest.raises(MemgateError):
        await world.rank("budget", min_seq=len(world.texts))
    await asyncio.sleep(0.2)
    assert world.model.calls == [["warm up"]]


async def test_a_redelivered_event_does_not_embed_again(world: World) -> None:
    await world.stored("a")
    embedded = sum(len(call) for call in world.model.calls)
    await world.stored("a")
    assert sum(len(call) for call in world.model.calls) == embedded


async def test_a_deleted_memory_loses_its_vector(world: World) -> None:
    await world.stored("a", "c")
    del world.texts["a"]
    await world.fake.deliver(DURABLE, [MemoriesDeleted(partition="p0", owner=OWNER,
                                                       memory_ids=["a"]).to_json()])
    ranked = await world.rank("budget review numbers")
    assert ranked[0] == "c" and "a" not in ranked


async def test_a_restarted_embedder_ranks_with_the_vectors_it_made_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = FakeEmbedder()
    monkeypatch.setattr(embedder_module, "OnnxEmbedder", lambda *_, **__: model)
    texts = {"a": "budget review numbers", "b": "team lunch friday"}
    fake = FakeBus({subjects.store("p0", "texts"): texts_route(texts),
                    subjects.store("p0", "catalog"): catalog_route(texts)})
    for run in range(2):
        actor = EmbedderActor(partition="p0", path=tmp_path / "vectors.duckdb",
                              model=Path("m"), tokenizer=Path("t"), bus=fake, batch=4)
        async with served(actor) as bus:
            world = World(bus, fake, model, texts)
            if run == 0:
                await world.stored("a", "b")
            embedded = sum(len(call) for call in model.calls)
            assert (await world.rank("team lunch friday"))[0] == "b"
            assert sum(len(call) for call in model.calls) == embedded + 1  # the query only


async def test_a_new_memory_of_a_loaded_owner_is_embedded_after_one_storage_request(
    world: World,
) -> None:
    """Its text comes with its catalog row: no second request for it."""
    await world.stored("a")  # the owner's catalog is loaded
    world.texts["d"] = "zanzibar harbour trip"
    world.fake.asked.clear()
    await world.fake.deliver(DURABLE, [MemoryStored(partition="p0", owner=OWNER, memory_id="d",
                                                    seq=4).to_json()])
    assert [subject for subject, _ in world.fake.asked] == [subjects.store("p0", "catalog")]
    assert (await world.rank("zanzibar harbour trip"))[0] == "d"

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
from memgate.actors.embedder import BACKGROUND_BATCH, EmbedderActor
from memgate.bus import subjects
from memgate.contracts.events import MemoriesDeleted, MemoryStored
from memgate.contracts import Contract
from memgate.contracts.internal import (
    CatalogRequest, Owner, Ranking, RankRequest, RecallFilters,
)
from memgate.runtime.actor import BACKGROUND_NICE
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
        return (await self.ranking(query, min_seq=min_seq, exclude=exclude,
                                   namespace=namespace)).memory_ids

    async def ranking(self, query: str, *, min_seq: int = 0, exclude: tuple[str, ...] = (),
                      namespace: str | None = None, wait_ms: int = 1000,
                      owner: Owner = OWNER) -> Ranking:
        return await self.bus.call(subjects.embed("p0", "rank"), RankRequest(
            filters=RecallFilters(owner=owner, namespace=namespace), query=query, depth=100,
            min_seq=min_seq, exclude=list(exclude), wait_ms=wait_ms), Ranking)

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


async def test_a_rank_embeds_a_backlog_of_its_own_scope_and_its_events_do_not_again(
        world: World) -> None:
    """Read-your-writes at any backlog: a rank that finds many versions without vectors (a
    burst of remembers, their events still waiting) has them embedded first and ranks them
    all; the events that come after find them embedded (at saturation, embedding a version
    twice cost 40% more CPU per remember: bench.compare)."""
    world.texts.update({f"m{i}": f"budget note {i}" for i in range(3 * BACKGROUND_BATCH)})
    world.fake.consumers[DURABLE].pending = len(world.texts)  # their events wait
    ranking = await world.ranking("budget", min_seq=len(world.texts))
    assert sorted(ranking.memory_ids) == sorted(world.texts) and ranking.unembedded == 0
    embedded = [text for call in world.model.calls[1:] for text in call if text != "budget"]
    assert sorted(embedded) == sorted(world.texts.values())
    world.fake.consumers[DURABLE].pending = 0
    await world.stored(*world.texts)
    assert [text for call in world.model.calls[1:] for text in call if text != "budget"] == embedded


async def test_a_rank_whose_wait_ends_ranks_without_the_versions_still_missing(
        world: World) -> None:
    """The recall says `degraded: ["cosine"]` from the count, never that it is complete."""
    await world.stored("a")
    world.texts["d"] = "budget lunch"  # remembered; its event has not come yet
    ranking = await world.ranking("budget", min_seq=4, wait_ms=0)
    assert ranking.unembedded == 1 and sorted(ranking.memory_ids) == ["a", "b", "c"]
    ranking = await world.ranking("budget", min_seq=4)  # embedded meanwhile or now
    assert ranking.unembedded == 0 and sorted(ranking.memory_ids) == ["a", "b", "c", "d"]


async def test_a_rank_embeds_the_versions_its_filters_allow_not_the_rest(world: World) -> None:
    await world.fake.deliver(DURABLE, [MemoryStored(
        partition="p0", owner=OWNER, memory_id=i, seq=n).to_json()
        for n, i in enumerate(world.texts, start=1)])
    ranking = await world.ranking("budget", namespace="elsewhere", wait_ms=0)
    assert ranking == Ranking(memory_ids=[])


async def test_a_waiting_rank_goes_before_the_background_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another member's burst is embedded in small batches; a rank's versions are embedded
    before the background's next batch, so it waits for at most the one being embedded."""
    gate, entered = threading.Event(), threading.Semaphore(0)
    model = FakeEmbedder(gate)
    embed = model.embed

    def embed_noting_entry(texts: list[str]) -> np.ndarray:
        entered.release()
        return embed(texts)

    monkeypatch.setattr(model, "embed", embed_noting_entry)
    monkeypatch.setattr(embedder_module, "OnnxEmbedder", lambda *_, **__: model)
    burst = {f"o{i}": f"another note {i}" for i in range(3 * BACKGROUND_BATCH)}
    mine = {"a": "budget review numbers", "b": "team lunch friday"}
    texts = burst | mine
    owners = {i: OTHER for i in burst} | {i: OWNER for i in mine}
    fake = FakeBus({subjects.store("p0", "texts"): texts_route(texts),
                    subjects.store("p0", "catalog"): catalog_route(texts, owners)})
    actor = EmbedderActor(partition="p0", path=tmp_path / "vectors.duckdb", model=Path("m"),
                          tokenizer=Path("t"), bus=fake, batch=4)
    gate.set()
    async with served(actor) as bus:
        world = World(bus, fake, model, texts)
        assert entered.acquire(timeout=1)  # the warm-up
        gate.clear()
        events = asyncio.create_task(fake.deliver(DURABLE, [MemoryStored(
            partition="p0", owner=OTHER, memory_id=i, seq=n).to_json()
            for n, i in enumerate(burst, start=1)]))
        # the first background batch is on the model, then the rank's on the urgent thread
        assert await asyncio.to_thread(entered.acquire, True, 10)
        ranking = asyncio.create_task(world.ranking("budget review numbers",
                                                    min_seq=len(texts)))
        assert await asyncio.to_thread(entered.acquire, True, 10)
        gate.set()
        assert (await ranking).memory_ids[0] == "a"
        await events
    calls = [set(call) for call in model.calls]
    urgent = next(n for n, call in enumerate(calls) if call <= set(mine.values()))
    before = sum(len(call) for call in calls[:urgent] if call <= set(burst.values()))
    assert before <= BACKGROUND_BATCH  # the one batch under way


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


async def test_the_background_waits_while_a_rank_is_answered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst's backlog takes no core from the recalls after it: while the embedder answers a
    rank (its recall waits), the background model thread does not run."""
    model = FakeEmbedder()
    monkeypatch.setattr(embedder_module, "OnnxEmbedder", lambda *_, **__: model)
    monkeypatch.setattr(embedder_module, "YIELD_MAX_S", 10.0)
    texts = {f"o{i}": f"another note {i}" for i in range(3)} | {"a": "budget review numbers"}
    owners = {i: OTHER for i in texts} | {"a": OWNER}
    catalog, asked, answer = catalog_route(texts, owners), asyncio.Event(), asyncio.Event()

    async def slow_for_owner(payload: bytes) -> Contract:
        if CatalogRequest.model_validate_json(payload).owner == OWNER:
            asked.set()
            await answer.wait()  # the rank is being answered meanwhile
        return await catalog(payload)

    fake = FakeBus({subjects.store("p0", "texts"): texts_route(texts),
                    subjects.store("p0", "catalog"): slow_for_owner})
    actor = EmbedderActor(partition="p0", path=tmp_path / "vectors.duckdb", model=Path("m"),
                          tokenizer=Path("t"), bus=fake, batch=4)
    async with served(actor) as bus:
        world = World(bus, fake, model, texts)
        ranking = asyncio.create_task(world.ranking("budget", min_seq=len(texts)))
        await asyncio.wait_for(asked.wait(), 5)
        events = asyncio.create_task(fake.deliver(DURABLE, [MemoryStored(
            partition="p0", owner=OTHER, memory_id=i, seq=n).to_json()
            for n, i in enumerate(texts, start=1) if i != "a"]))
        done, _ = await asyncio.wait({events}, timeout=0.5)
        assert not done and model.calls == [["warm up"]]
        answer.set()
        assert (await ranking).memory_ids == ["a"]
        await asyncio.wait_for(events, 5)
        assert sorted(t for call in model.calls for t in call if t.startswith("another")) == [
            texts[i] for i in owners if i != "a"]

"""Storage on the in-memory broker (a real DuckDB file in a temp dir, the events stream faked):
remember, list, forget, limits, and events that carry ids only."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from memgate.actors.storage import StorageActor
from memgate.bus import subjects
from memgate.contracts import ErrorCode, ForgetResult, ListResult, RememberResult
from memgate.contracts.errors import MemgateError
from memgate.contracts.internal import (
    CatalogRequest, CatalogRows, Owner, StoreForget, StoreQuery, StoreRemember,
)
from memgate.storage import Limits
from tests.fakes import FakeBus, FakePublisher, Served, served

pytestmark = pytest.mark.unit

OWNER = Owner(tenant="ws", subject_id="member")
SECRET_WORD = "zanzibar"


@dataclass
class World:
    bus: Served
    publisher: FakePublisher

    async def remember(self, text: str, *, key: str | None = None,
                       credential: str = "cred") -> RememberResult:
        return await self.bus.call(subjects.store("p0", "remember"), StoreRemember(
            owner=OWNER, credential_id=credential, member_id=OWNER.subject_id, namespace="n",
            key=key, text=text, retention_days=30), RememberResult)

    async def list(self, *, key: str | None = None) -> ListResult:
        return await self.bus.call(subjects.store("p0", "list"),
                                   StoreQuery(owner=OWNER, key=key, limit=20), ListResult)

    async def forget(self, *, memory_id: str | None = None,
                     key: str | None = None) -> ForgetResult:
        return await self.bus.call(subjects.store("p0", "forget"),
                                   StoreForget(owner=OWNER, memory_id=memory_id, key=key),
                                   ForgetResult)


@asynccontextmanager
async def storage_in(path: Path, limits: Limits | None = None) -> AsyncIterator[World]:
    publisher = FakePublisher()
    actor = StorageActor(partition="p0", path=path / "memories.duckdb", publisher=publisher,  # type: ignore[arg-type]
                         bus=FakeBus(), limits=limits)
    async with served(actor) as bus:
        yield World(bus, publisher)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async with storage_in(tmp_path) as world:
        yield world


async def test_remember_then_list_shows_the_newest_first(world: World) -> None:
    first = await world.remember("first")
    second = await world.remember("second")
    listed = await world.list()
    assert [m.memory_id for m in listed.memories] == [second.memory_id, first.memory_id]
    assert [m.text for m in listed.memories] == ["second", "first"]


async def test_remembering_a_key_again_supersedes_its_current_version(world: World) -> None:
    await world.remember("old", key="k")
    newer = await world.remember("new", key="k")
    assert newer.superseded == 1
    assert [m.text for m in (await world.list(key="k")).memories] == ["new"]


async def test_forget_by_key_deletes_every_version(world: World) -> None:
    await world.remember("old", key="k")
    await world.remember("new", key="k")
    kept = await world.remember("other")
    assert (await world.forget(key="k")).deleted == 2
    assert [m.memory_id for m in (await world.list()).memories] == [kept.memory_id]


async def test_forgetting_nothing_is_not_found(world: World) -> None:
    with pytest.raises(MemgateError) as caught:
        await world.forget(memory_id="no-such-memory")
    assert caught.value.code == ErrorCode.NOT_FOUND


async def test_events_are_published_with_ids_only_and_unique_message_ids(world: World) -> None:
    stored = await world.remember(f"the {SECRET_WORD} plan")
    await world.forget(memory_id=stored.memory_id)
    await world.publisher.wait_for(2)
    assert all(SECRET_WORD not in payload.decode() for _, payload, _ in world.publisher.events)
    assert [json.loads(p)["memoryId" if i == 0 else "memoryIds"]
            for i, (_, p, _) in enumerate(world.publisher.events)] == \
        [stored.memory_id, [stored.memory_id]]
    msg_ids = [msg_id for _, _, msg_id in world.publisher.events]
    assert len(set(msg_ids)) == 2
    assert all(subject == subjects.memory_events("p0") for subject, _, _ in world.publisher.events)


async def test_the_rate_limit_is_per_credential(tmp_path: Path) -> None:
    async with storage_in(tmp_path, Limits(remembers_per_hour=2)) as world:
        await world.remember("one")
        await world.remember("two")
        with pytest.raises(MemgateError) as caught:
            await world.remember("three")
        assert caught.value.code == ErrorCode.AGENT_MEMORY_RATE_LIMITED
        assert caught.value.details["retryAfterSeconds"] > 0
        await world.remember("three", credential="another")


async def test_a_full_member_is_refused_with_agent_memory_full(tmp_path: Path) -> None:
    async with storage_in(tmp_path, Limits(versions_per_member=2)) as world:
        await world.remember("one")
        await world.remember("two")
        with pytest.raises(MemgateError) as caught:
            await world.remember("three", credential="another")
        assert caught.value.code == ErrorCode.AGENT_MEMORY_FULL


async def test_a_catalog_carries_its_versions_texts_only_when_asked(world: World) -> None:
    """An indexer or embedder told of new versions gets their texts with their metadata (one
    request, not two), and a catalog loaded whole stays text-free."""
    first = await world.remember("first")
    second = await world.remember("second")
    for texts in (False, True):
        rows = await world.bus.call(subjects.store("p0", "catalog"), CatalogRequest(
            owner=OWNER, after_seq=0, texts=texts), CatalogRows)
        assert rows.memory_ids == [first.memory_id, second.memory_id]
        assert rows.texts == (["first", "second"] if texts else None)
    newer = await world.bus.call(subjects.store("p0", "catalog"), CatalogRequest(
        owner=OWNER, after_seq=rows.seqs[0], texts=True), CatalogRows)
    assert (newer.memory_ids, newer.texts) == ([second.memory_id], ["second"])

"""The registry on the in-memory broker (a real DuckDB file in a temp dir; the directory and
the events stream faked): citations checked on remember, re-verified later, entities counted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from memgate.actors.registry import RegistryActor
from memgate.bus import subjects
from memgate.contracts import Contract, Done, ErrorCode
from memgate.contracts.errors import ForbiddenError, MemgateError
from memgate.contracts.internal import OwnerCheck
from memgate.contracts.registry import (
    CheckRemember, Citations, CollectionCreated, DocumentVersion, Verification, Verify,
)
from memgate.storage.directory import hash_token
from tests.fakes import FakeBus, FakePublisher, Served, served

pytestmark = pytest.mark.unit

OWNER_TOKEN = "owner-token"
WS = "ws"
T = TypeVar("T", bound=Contract)


@dataclass
class World:
    bus: Served
    publisher: FakePublisher
    collection_id: str

    async def admin(self, operation: str, body: dict[str, Any], result: type[T],
                    token: str = OWNER_TOKEN, **params: str) -> T:
        return await self.bus.command(subjects.admin(f"registry.{operation}"), token, body,
                                      result, wsId=WS, **params)

    async def put(self, document_id: str, *texts: str, entities: list[dict[str, Any]] | None = None
                  ) -> DocumentVersion:
        passages = [{"passageId": f"{document_id}-{n}", "text": text,
                     "entities": entities or []} for n, text in enumerate(texts)]
        return await self.admin("documents.put", {"collectionId": self.collection_id,
                                                  "passages": passages},
                                DocumentVersion, documentId=document_id)

    async def cite(self, *passage_ids: str) -> Citations:
        return await self.bus.call(subjects.registry("check_remember"), CheckRemember(
            workspace_id=WS, passage_ids=list(passage_ids)), Citations)

    async def verify(self, citations: Citations, query: str | None = None) -> Verification:
        return await self.bus.call(subjects.registry("verify"), Verify(
            workspace_id=WS, citations={"m": citations.citations}, query=query), Verification)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    async def owner_check(payload: bytes) -> Done:
        check = OwnerCheck.model_validate_json(payload)
        if check.token_hash != hash_token(OWNER_TOKEN) or check.workspace_id != WS:
            raise ForbiddenError("only the workspace owner may do this")
        return Done()

    publisher = FakePublisher()
    actor = RegistryActor(path=tmp_path / "registry.duckdb",
                          bus=FakeBus({subjects.DIRECTORY_OWNER_CHECK: owner_check}),
                          publisher=publisher)  # type: ignore[arg-type]
    async with served(actor) as bus:
        created = await bus.command(subjects.admin("registry.collections.create"), OWNER_TOKEN,
                                    {"name": "handbook"}, CollectionCreated, wsId=WS)
        yield World(bus, publisher, created.collection_id)


async def test_only_the_owner_changes_the_registry(world: World) -> None:
    with pytest.raises(MemgateError) as caught:
        await world.admin("collections.create", {"name": "x"}, CollectionCreated,
                          token="someone-else")
    assert caught.value.code == ErrorCode.FORBIDDEN


async def test_a_live_passage_is_cited_by_reference_and_hash(world: World) -> None:
    version = await world.put("doc", "the leave policy is 25 days")
    [citation] = (await world.cite("doc-0")).citations
    assert (citation.document_id, citation.version) == ("doc", version.version)
    assert (await world.verify(Citations(citations=[citation]))) == Verification()


async def test_an_unknown_passage_cannot_be_cited(world: World) -> None:
    with pytest.raises(MemgateError) as caught:
        await world.cite("nowhere")
    assert caught.value.code == ErrorCode.NOT_FOUND


async def test_a_changed_source_is_flagged_and_a_deleted_one_hides_the_memory(
        world: World) -> None:
    await world.put("doc", "the leave policy is 25 days")
    cited = await world.cite("doc-0")
    await world.put("doc", "the leave policy is 30 days")
    assert (await world.verify(cited)).changed == ["m"]
    await world.admin("documents.delete", {}, Done, documentId="doc")
    assert (await world.verify(cited)).hidden == ["m"]
    await world.publisher.wait_for(3)
    facts = [json.loads(payload) for _, payload, _ in world.publisher.events]
    assert [f["event"] for f in facts] == ["doc_upserted", "doc_upserted", "doc_deleted"]


async def test_verify_counts_the_entities_a_query_names(world: World) -> None:
    entities: list[dict[str, Any]] = [{"id": "e1", "name": "Acme Corp", "aliases": ["ACME"]},
                {"id": "e2", "name": "東京"}]
    await world.put("doc", "Acme opened an office in Tokyo", entities=entities)
    cited = await world.cite("doc-0")
    assert (await world.verify(cited, "what did acme do in 東京都?")).entity_matches == {"m": 2}
    assert (await world.verify(cited, "acmeish")).entity_matches == {}

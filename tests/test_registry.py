"""Citations, live re-verification, entity ranking, context sets (SPEC §2.4, §3.3, §3.5, §3.8)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nats.js.api import DeliverPolicy

from memgate.contracts.errors import (
    ContextSetScopeRefusedError,
    NotFoundError,
    ValidationFailedError,
)
from tests.conftest import ADMIN_TOKEN, Member, Memgate, eventually

PASSAGE = "The Orion project ships its releases every Friday afternoon."


async def put_document(
    memgate: Memgate, owner: Member, document_id: str, collection_id: str, **fields: Any
) -> dict[str, Any]:
    body = {
        "collectionId": collection_id,
        "passages": [
            {
                "passageId": f"{document_id}-p1",
                "text": PASSAGE,
                "entities": [{"id": "e-orion", "name": "Orion", "aliases": ["オリオン", "ORN"]}],
            },
        ],
        **fields,
    }
    return await memgate.ok(
        "PUT", f"/api/w/{owner.workspace_id}/documents/{document_id}", owner.token, body
    )


async def collection(memgate: Memgate, owner: Member, name: str = "handbook") -> str:
    created = await memgate.ok(
        "POST", f"/api/w/{owner.workspace_id}/collections", owner.token, {"name": name}
    )
    return str(created["collectionId"])


async def test_a_citation_stores_the_passage_hash_and_never_its_text(
    memgate: Memgate, transport: str
) -> None:
    owner = await memgate.workspace()
    handbook = await collection(memgate, owner)
    assert (await put_document(memgate, owner, "doc1", handbook))["version"] == 1
    agent = await memgate.agent(transport, await memgate.credential(owner))
    await agent.remember("notes", "releases go out on Fridays", citations=["doc1-p1"])
    [memory] = (await agent.list()).memories
    assert [c.model_dump() for c in memory.citations] == [
        {
            "passage_id": "doc1-p1",
            "document_id": "doc1",
            "version": 1,
            "sha256": hashlib.sha256(PASSAGE.encode()).hexdigest(),
        }
    ]
    assert memory.source_state == "current"
    with pytest.raises(NotFoundError) as unknown:
        await agent.remember("notes", "cites nothing real", citations=["no-such-passage"])
    assert unknown.value.details == {"passageIds": ["no-such-passage"]}
    with pytest.raises(ValidationFailedError):
        await agent.remember("notes", "too many", citations=[f"p{i}" for i in range(21)])
    for path in memgate.settings.data_dir.rglob("*.duckdb*"):
        assert b"afternoon" not in path.read_bytes(), path
    await agent.close()


async def test_restricted_documents_cannot_be_cited(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    handbook = await collection(memgate, owner)
    await put_document(memgate, owner, "secret", handbook, restricted=True)
    agent = await memgate.agent("rest", await memgate.credential(owner))
    with pytest.raises(NotFoundError):
        await agent.remember("notes", "from a restricted doc", citations=["secret-p1"])


async def test_a_gone_expired_or_restricted_source_hides_it_and_a_new_version_marks_it_changed(
    memgate: Memgate, transport: str
) -> None:
    owner = await memgate.workspace()
    handbook = await collection(memgate, owner)
    documents = ("kept", "deleted", "expiring", "restricting")
    for document in documents:
        await put_document(memgate, owner, document, handbook)
    agent = await memgate.agent(transport, await memgate.credential(owner))
    for document in documents:
        await agent.remember(
            "notes", f"Orion releases: from {document}", citations=[f"{document}-p1"]
        )
    await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/documents/deleted", owner.token)
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    await put_document(memgate, owner, "expiring", handbook, expiresAt=past)
    await put_document(memgate, owner, "restricting", handbook, restricted=True)
    await put_document(memgate, owner, "kept", handbook)  # version 2, same text

    listed = await agent.list()
    assert listed.hidden in (2, 3)  # the deleted document's memory: hidden, then cascaded away
    assert [(m.text, m.source_state) for m in listed.memories] == [
        ("Orion releases: from kept", "changed")
    ]

    async def expired_and_restricted_are_hidden() -> bool:
        return (await agent.list()).hidden == 2

    await eventually(expired_and_restricted_are_hidden)
    recalled = await agent.recall("Orion releases")
    assert recalled.hidden == 2
    assert [m.text for m in recalled.memories] == ["Orion releases: from kept"]
    await agent.close()


async def test_deleting_a_cited_document_or_its_collection_deletes_the_memory(
    memgate: Memgate,
) -> None:
    owner = await memgate.workspace()
    handbook, archive = await collection(memgate, owner), await collection(memgate, owner, "old")
    await put_document(memgate, owner, "doc1", handbook)
    await put_document(memgate, owner, "doc2", archive)
    agent = await memgate.agent("rest", await memgate.credential(owner))
    await agent.remember("notes", "cites doc1", citations=["doc1-p1"])
    await agent.remember("notes", "cites doc2", citations=["doc2-p1"])
    await agent.remember("notes", "filed in the archive", collection_id=archive)
    kept = await agent.remember("notes", "cites nothing")
    await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/documents/doc1", owner.token)
    await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/collections/{archive}", owner.token)

    async def cascaded() -> bool:
        listed = await agent.list()
        return listed.hidden == 0 and [m.memory_id for m in listed.memories] == [kept.memory_id]

    await eventually(cascaded)  # deleted, not merely hidden


async def test_entities_named_in_the_query_rank_memories_citing_them(
    memgate: Memgate, transport: str
) -> None:
    owner = await memgate.workspace()
    handbook = await collection(memgate, owner)
    await put_document(memgate, owner, "orion", handbook)
    agent = await memgate.agent(transport, await memgate.credential(owner))
    cited = await agent.remember("notes", "the release train leaves weekly", citations=["orion-p1"])
    await agent.remember("notes", "lunch is at noon")
    for query in ("what does ORN do", "オリオンについて", "ｏｒｉｏｎ status"):
        result = await agent.recall(query)
        top = result.memories[0]
        assert (top.memory_id, top.ranks.entity) == (cited.memory_id, 1), query
    await agent.close()


async def test_a_credential_bound_to_a_context_set_stays_inside_it(
    memgate: Memgate, transport: str
) -> None:
    owner = await memgate.workspace()
    inside, outside = (
        await collection(memgate, owner, "in"),
        await collection(memgate, owner, "out"),
    )
    await put_document(memgate, owner, "doc-out", outside)
    context_set = await memgate.ok(
        "POST",
        f"/api/w/{owner.workspace_id}/context-sets",
        owner.token,
        {"name": "support", "collectionIds": [inside]},
    )
    unbound = await memgate.agent(transport, await memgate.credential(owner))
    await unbound.remember("notes", "outside the set", collection_id=outside)
    token = (
        await memgate.ok(
            "POST",
            f"/api/w/{owner.workspace_id}/credentials",
            owner.token,
            {
                "name": "bound",
                "scopes": ["memory:read", "memory:write"],
                "contextSetId": context_set["contextSetId"],
            },
        )
    )["token"]
    bound = await memgate.agent(transport, token)

    await bound.remember("notes", "inside the set", collection_id=inside)
    for refused in (
        bound.remember("notes", "x", collection_id=outside),
        bound.remember("notes", "no collection at all"),
        bound.remember("notes", "cites outside", citations=["doc-out-p1"]),
        bound.list(collection_id=outside),
        bound.recall("set", collection_id=outside),
    ):
        with pytest.raises(ContextSetScopeRefusedError):
            await refused
    assert [m.text for m in (await bound.list()).memories] == ["inside the set"]
    assert [m.text for m in (await bound.recall("the set")).memories] == ["inside the set"]
    outside_memory = (await unbound.list(collection_id=outside)).memories[0]
    with pytest.raises(NotFoundError):
        await bound.forget(memory_id=outside_memory.memory_id)

    await memgate.ok(
        "PUT",
        f"/api/w/{owner.workspace_id}/context-sets/{context_set['contextSetId']}",
        owner.token,
        {"name": "support", "collectionIds": [outside]},
    )  # the set as it is now
    assert [m.text for m in (await bound.list()).memories] == ["outside the set"]
    await bound.close()
    await unbound.close()


async def test_only_owner_or_operator_change_the_registry_and_unknown_sets_are_refused(
    memgate: Memgate,
) -> None:
    owner = await memgate.workspace()
    editor = await memgate.member(owner)
    path = f"/api/w/{owner.workspace_id}/collections"
    assert (await memgate.admin("POST", path, editor.token, {"name": "x"})).status_code == 403
    assert (await memgate.admin("POST", path, ADMIN_TOKEN, {"name": "x"})).status_code == 200
    unknown_set = await memgate.admin(
        "POST",
        f"/api/w/{owner.workspace_id}/credentials",
        owner.token,
        {"name": "b", "scopes": ["memory:read"], "contextSetId": "cs_nope"},
    )
    assert unknown_set.status_code == 404


async def test_registry_changes_are_announced_as_events(memgate: Memgate) -> None:
    owner = await memgate.workspace()
    handbook = await collection(memgate, owner)
    nc = await memgate.internal("storage")  # the registry's consumer reads its events
    events = await nc.jetstream().subscribe("mem.evt.registry.>",
                                            deliver_policy=DeliverPolicy.NEW)
    await put_document(memgate, owner, "doc1", handbook)
    await memgate.ok("DELETE", f"/api/w/{owner.workspace_id}/documents/doc1", owner.token)
    upserted, deleted = await events.next_msg(timeout=5), await events.next_msg(timeout=5)
    assert (upserted.subject, deleted.subject) == (
        "mem.evt.registry.doc_upserted",
        "mem.evt.registry.doc_deleted",
    )
    assert b"afternoon" not in upserted.data
    await nc.close()

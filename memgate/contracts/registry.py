"""The registry of collections, documents, passages and context sets (SPEC §2.4, §3.3, §3.8).

Passage text enters only to be hashed: the registry keeps its SHA-256 and resolved entities.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from memgate.contracts.base import Contract, Id, Instant

Name = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class Entity(Contract):
    id: Id
    name: Name
    aliases: list[Name] = Field(default_factory=list, max_length=50)


class PassageIn(Contract):
    passage_id: Id
    text: str = Field(min_length=1, max_length=100_000)
    entities: list[Entity] = Field(default_factory=list, max_length=200)


class CreateCollection(Contract):
    name: str = Field(min_length=1, max_length=200)


class CollectionCreated(Contract):
    collection_id: str


class PutDocument(Contract):
    collection_id: Id
    expires_at: Instant | None = None  # converted to UTC
    restricted: bool = False
    passages: list[PassageIn] = Field(default_factory=list, max_length=5000)


class DocumentVersion(Contract):
    document_id: str
    version: int


class ContextSetIn(Contract):
    name: str = Field(min_length=1, max_length=200)
    collection_ids: list[Id] = Field(default_factory=list, max_length=1000)
    document_ids: list[Id] = Field(default_factory=list, max_length=10_000)


class ContextSetSaved(Contract):
    context_set_id: str


class Citation(Contract):
    """What a memory keeps of a passage it cites: a reference and a hash, never the text."""

    passage_id: str
    document_id: str
    version: int
    sha256: str


# --- internal requests (governance and recall ask; the registry answers) ---


class CheckRemember(Contract):
    workspace_id: str
    context_set_id: str | None = None
    collection_id: str | None = None
    passage_ids: list[str] = Field(default_factory=list)


class Citations(Contract):
    citations: list[Citation]


class ScopeRequest(Contract):
    workspace_id: str
    context_set_id: str


class Scope(Contract):
    """A context set as it is now: what a bound credential may touch."""

    exists: bool = True
    collection_ids: list[str]
    document_ids: list[str]


class Verify(Contract):
    """Re-check the citations of these memories; with `query`, also count named entities."""

    workspace_id: str
    context_set_id: str | None = None
    citations: dict[str, list[Citation]]  # memory id → its citations
    query: str | None = None


class Verification(Contract):
    hidden: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)
    entity_matches: dict[str, int] = Field(default_factory=dict)  # memory id → entities named

"""Messages between actors on internal subjects (`mem.int.*`). Agents never send these."""

from __future__ import annotations

from datetime import datetime

from pydantic import ConfigDict, Field

from memgate.contracts.base import Contract
from memgate.contracts.memory import Memory
from memgate.contracts.registry import Citation


class Owner(Contract):
    """Whose memories: the tenant (workspace) and the subject (the member who owns them).

    Open like events, which carry it: a field added by a newer process is ignored, not fatal.
    """

    model_config = ConfigDict(extra="ignore")

    tenant: str
    subject_id: str


class StoreRemember(Contract):
    owner: Owner
    credential_id: str
    namespace: str
    key: str | None = None
    collection_id: str | None = None
    text: str  # already masked
    masked: dict[str, int] = Field(default_factory=dict)
    retention_days: int
    citations: list[Citation] = Field(default_factory=list)


class StoreQuery(Contract):
    owner: Owner
    namespace: str | None = None
    key: str | None = None
    collection_id: str | None = None
    collection_ids: list[str] | None = None  # a bound credential's context set
    as_of: datetime | None = None
    limit: int
    cursor: str | None = None


class StoreForget(Contract):
    owner: Owner
    memory_id: str | None = None
    namespace: str | None = None
    key: str | None = None
    collection_ids: list[str] | None = None  # a bound credential's context set


class StorePurge(Contract):
    tenant: str
    subject_id: str | None = None  # None: every member of the workspace
    memory_ids: list[str] | None = Field(default=None, max_length=1000)  # None: all


class Candidates(Contract):
    """Recall's window, newest first, as columns (one parse for 300 rows, not 300 models)."""

    memory_ids: list[str]
    namespaces: list[str]
    keys: list[str | None]
    collection_ids: list[str | None]
    texts: list[str]
    created_at: list[datetime]
    superseded_at: list[datetime | None]
    citations: list[list[Citation]]

    def memory(self, i: int) -> Memory:
        return Memory(memory_id=self.memory_ids[i], namespace=self.namespaces[i], key=self.keys[i],
                      collection_id=self.collection_ids[i], text=self.texts[i],
                      created_at=self.created_at[i], superseded_at=self.superseded_at[i],
                      citations=self.citations[i])


class TextsRequest(Contract):
    owner: Owner
    memory_ids: list[str] | None = None  # None: every version the owner has


class OwnedText(Contract):
    memory_id: str
    text: str


class Texts(Contract):
    items: list[OwnedText]


class RankRequest(Contract):
    """Rank these candidates for `query` (the BM25 and cosine channels)."""

    owner: Owner
    query: str
    memory_ids: list[str]
    vector: list[float] | None = None  # the query's embedding, when the caller has it


class Ranking(Contract):
    memory_ids: list[str]  # best first; candidates that did not match are absent


class PrincipalRequest(Contract):
    token_hash: str


class OwnerCheck(Contract):
    """Is this the workspace owner's member token, or the operator's?"""

    token_hash: str
    workspace_id: str


class Ready(Contract):
    actor: str


class RecallQuery(Contract):
    owner: Owner
    query: str
    namespace: str | None = None
    collection_id: str | None = None
    collection_ids: list[str] | None = None  # a bound credential's context set
    context_set_id: str | None = None
    as_of: datetime | None = None
    limit: int

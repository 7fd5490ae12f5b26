"""Messages between actors on internal subjects (`mem.int.*`). Agents never send these."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import ConfigDict, Field

from memgate.contracts.base import Contract
from memgate.contracts.memory import Extras, Memory, RememberResult
from memgate.contracts.registry import Citation


SPACE_OWNER_PREFIX = "space-"  # a space's memories are stored under the owner space-<spaceId>


def space_owner(space_id: str) -> str:
    """The subject id under which a space's mem0 memories are stored (one index per space)."""
    return f"{SPACE_OWNER_PREFIX}{space_id}"


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
    member_id: str  # who writes it: the member whose version limit counts it (SPEC §3.9)
    namespace: str
    key: str | None = None
    collection_id: str | None = None
    text: str  # already masked
    masked: dict[str, int] = Field(default_factory=dict)
    retention_days: int
    citations: list[Citation] = Field(default_factory=list)
    derived_from: list[str] = Field(default_factory=list, max_length=10_000)  # source records
    extras: Extras | None = None  # a mem0 memory's metadata (masked), timestamp, expiry
    idempotency: str | None = None  # the SHA-256 of the caller's idempotency key
    created_at: datetime | None = None  # kept from elsewhere: the operator's import only


class StoreImport(Contract):
    """A bulk import's governed items (one owner's partition), stored in one transaction, each
    stored or refused alone. `operator`: the operator's, counted by no hourly budget."""

    items: list[StoreRemember] = Field(min_length=1, max_length=1000)
    operator: bool = False


class StoreRememberAll(Contract):
    """Versions stored together or not at all: if a limit refuses one, none is stored (one
    owner's, in one partition)."""

    items: list[StoreRemember] = Field(min_length=1, max_length=1000)


class RememberedAll(Contract):
    results: list[RememberResult]  # in the order of the items


class StoreQuery(Contract):
    owner: Owner
    namespace: str | None = None
    key: str | None = None
    collection_id: str | None = None
    collection_ids: list[str] | None = None  # a bound credential's context set
    namespaces: list[str] | None = None  # any of these (a mem0 filter's entities)
    keys: list[str] | None = Field(default=None, max_length=1000)  # any of these (mem0 ids)
    as_of: datetime | None = None
    limit: int
    cursor: str | None = None


class StoreForget(Contract):
    owner: Owner
    memory_id: str | None = None
    namespace: str | None = None
    key: str | None = None
    collection_ids: list[str] | None = None  # a bound credential's context set
    namespaces: list[str] | None = None  # any of these (a mem0 filter's entities)
    keys: list[str] | None = Field(default=None, max_length=1000)  # any of these (mem0 ids)
    member_id: str | None = None  # whose idempotency key (with `idempotency`)
    idempotency: str | None = None  # the SHA-256 of the caller's idempotency key


class StorePurge(Contract):
    tenant: str
    subject_id: str | None = None  # None: every member's agent memories, never a space's
    memory_ids: list[str] | None = Field(default=None, max_length=1000)  # None: all


class RecallFilters(Contract):
    """Which of an owner's versions a recall may rank: current at `as_of` (now when None),
    legal holds excluded, in the namespace / collection / context set given; the newest
    `window` of those only when an operator caps it (None: all of them)."""

    owner: Owner
    namespace: str | None = None
    collection_id: str | None = None
    collection_ids: list[str] | None = None  # a bound credential's context set
    namespaces: list[str] | None = None  # any of these (a mem0 filter's entities)
    memory_ids: list[str] | None = None  # any of these versions (a mem0 metadata filter's)
    as_of: datetime | None = None
    window: int | None = None


class RecallScope(Contract):
    """What recall learns from storage before ranking (a small reply, never texts)."""

    high_seq: int  # the owner's newest version's seq: channels catch up to it (read-your-writes)
    cited: dict[str, list[Citation]] = Field(default_factory=dict)  # allowed ones that cite
    total: int | None = None  # how many versions the filters allow; counted only if some cite


class RowsRequest(Contract):
    """These versions, if they still exist and the filters still allow them."""

    filters: RecallFilters
    memory_ids: list[str]


class Rows(Contract):
    memories: list[Memory]  # in no particular order; missing and filtered-out ids are absent


class CatalogRequest(Contract):
    """An owner's versions with a seq above `after_seq`: metadata, and their masked texts when
    `texts` (a caller caught up but for the few versions an event announced, which it lacks)."""

    owner: Owner
    after_seq: int = 0
    texts: bool = False


class CatalogRows(Contract):
    """Versions as columns, oldest first (one parse for thousands of rows, not one model each)."""

    high_seq: int  # the owner's newest seq when read: the caller is caught up to it
    memory_ids: list[str]
    seqs: list[int]
    namespaces: list[str]
    keys: list[str | None]
    collection_ids: list[str | None]
    created_at: list[datetime]
    superseded_at: list[datetime | None]
    legal_hold: list[bool]
    texts: list[str] | None = None  # when asked


class TextsRequest(Contract):
    owner: Owner
    memory_ids: list[str] | None = None  # None: every version the owner has


class OwnedText(Contract):
    memory_id: str
    text: str


class Texts(Contract):
    items: list[OwnedText]


class RankRequest(Contract):
    """The best `depth` of the owner's versions that the filters allow, for `query` (the BM25
    and cosine channels). A channel that has applied less than `min_seq` of the owner's
    versions catches up from storage first; `exclude` (hidden memories) never takes a place."""

    filters: RecallFilters
    query: str
    depth: int
    min_seq: int = 0
    exclude: list[str] = Field(default_factory=list)
    vector: list[float] | None = None  # the query's embedding, when the caller has it
    neighbours: int = Field(default=0, ge=0, le=8)  # per listed id, this many each way
    context: int = Field(default=0, ge=0)  # the indexer: the context channel's depth (0: off)
    # The conversation channel (policy/context.py): conversation turns leave the BM25 and
    # cosine lists, and the embedder adds their smoothed cosine.
    conversation: bool = False
    # The embedder: how long it may embed the versions the filters allow that have no vector
    # yet, ahead of its background work, before it ranks without them (read-your-writes; the
    # recall sends what is left of its cosine deadline).
    wait_ms: int = Field(default=1000, ge=0, le=60_000)


class Neighbours(Contract):
    """The allowed versions remembered just before and just after one, in its namespace by
    seq, nearest first (the sequence window's input)."""

    before: list[str] = Field(default_factory=list)
    after: list[str] = Field(default_factory=list)


class Ranking(Contract):
    memory_ids: list[str]  # best first; versions that did not match are absent
    neighbours: dict[str, Neighbours] = Field(default_factory=dict)  # when the request asks
    # The conversation channel's parts (policy/context.py), (id, score) best first: the
    # indexer's context BM25 when asked, the embedder's smoothed cosine + speaker bonus.
    context: list[tuple[str, float]] = Field(default_factory=list)
    smoothed: list[tuple[str, float]] = Field(default_factory=list)
    # The embedder: how many of the versions the filters allow it ranked without, their
    # vectors not made within the request's wait (the recall says the channel is degraded).
    unembedded: int = 0


class EmbedProgress(Contract):
    """An embedder's backlog, told to its partition's storage actor (`mem.int.embedded.<p>`,
    at most once): the newest version it has seen (None: none since it started) and how many
    of those it has not embedded yet (`runtime.backpressure`)."""

    model_config = ConfigDict(extra="ignore")

    seen: int | None = None
    left: int = Field(default=0, ge=0)


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
    namespaces: list[str] | None = None  # any of these (a mem0 filter's entities)
    memory_ids: list[str] | None = None  # any of these versions (a mem0 metadata filter's)
    context_set_id: str | None = None
    as_of: datetime | None = None
    limit: int


class StoreReap(Contract):
    """Retention (SPEC §3.9): delete every version past its `expires_at` at `now`, or older
    than its workspace's retentionDays (those named here), legal holds kept."""

    now: datetime
    retention_days: dict[str, Annotated[int, Field(ge=1, le=365)]] = Field(
        default_factory=dict)  # workspace id → days


class Reaped(Contract):
    deleted: int  # versions deleted (those derived from them included)


class Retentions(Contract):
    """Every workspace's retentionDays (the directory's answer to the reaper)."""

    retention_days: dict[str, int]


class RetentionRequest(Contract):
    pass

"""The mem0-compatible API of a memory space (SPEC §4.4): what the `mem0ai` client sends and what
it reads back, and the space-memories actor's internal answers.

Bodies come from the mem0 client in snake_case; the requests accept the options the client may
send and memgate does not use (`custom_instructions`, `custom_categories`, ...) and ignore them.
Results travel on the bus in camelCase like every contract; the REST routes render them in
mem0's snake_case (`model_dump()` by field name).

`metadata` (add, update, batch_update) is kept with the memory, every string in it masked like
the text, bounded (`policy.metadata`: 4 KiB of JSON as sent, 32 keys, 3 levels) and shown on
get, get_all, search and history; `filters` of get_all, search and delete_all select on it with
mem0's operators (`policy.metadata`). `expiration_date` (add, update: `YYYY-MM-DD`, a day after
today at the earliest) makes the memory expire at the start of that day, UTC (the reaper
deletes it then, or at the retention if sooner); `timestamp` (add, update: Unix seconds, from
1970 to a few minutes from now) is the `created_at` the memory is shown with.

`mem.int.spacemem.extract` (the sessions actor's extract_memories strategy) takes
`contracts.sessions.ExtractRequest` and answers `Extracted`, re-exported here.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictFloat, StrictInt

from memgate.contracts.base import ID_MAX, Contract
from memgate.contracts.sessions import ExtractEvent, ExtractRequest, Extracted

TEXT_MAX = 1000  # a memory's text (SPEC §3.2)
MESSAGE_MAX = 10_000  # a message given to the LLM (its facts are each at most TEXT_MAX)
MESSAGES_MAX = 200
ENTITY_MAX = 200
PAGE_SIZE_MAX = 100
TOP_K_MAX = 50
BATCH_MAX = 1000  # memories one batch_update or batch_delete names
DATE_CHARS = 10  # YYYY-MM-DD

Timestamp = StrictInt | StrictFloat  # Unix seconds (bounds checked against the clock)


class _Mem0Body(Contract):
    """A body from the mem0 client: options memgate does not use are accepted and ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class Message(_Mem0Body):
    # The role reaches the space's LLM as it is, so it is one of four words, never free text.
    role: Literal["user", "assistant", "system", "tool"] = "user"
    content: str = Field(min_length=1, max_length=MESSAGE_MAX)


class AddMemories(_Mem0Body):
    messages: list[Message] = Field(min_length=1, max_length=MESSAGES_MAX)
    user_id: str | None = Field(default=None, min_length=1, max_length=ENTITY_MAX)
    agent_id: str | None = Field(default=None, min_length=1, max_length=ENTITY_MAX)
    run_id: str | None = Field(default=None, min_length=1, max_length=ENTITY_MAX)
    filters: dict[str, Any] | None = None  # the v3 client's place for the entity ids
    infer: bool | None = None  # False: store the messages verbatim even with an LLM
    metadata: dict[str, Any] | None = None  # kept with every memory added, masked
    timestamp: Timestamp | None = None  # shown as their created_at
    expiration_date: str | None = Field(default=None, max_length=DATE_CHARS)


class SearchMemories(_Mem0Body):
    query: str = Field(min_length=1, max_length=TEXT_MAX)
    filters: dict[str, Any] | None = None
    top_k: int | None = Field(default=None, ge=1, le=TOP_K_MAX)
    limit: int | None = Field(default=None, ge=1, le=TOP_K_MAX)  # older clients' name
    # Results whose `score` is below it are left out. The score is memgate's fused score
    # (Reciprocal Rank Fusion, SPEC §3.5: the sum over channels of w_c / (k + rank_c)), not a
    # similarity in [0, 1]: with k = 60 and unit weights a memory first in every channel
    # scores about channels / 61 (under 0.1), so compare against scores search returned.
    threshold: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class ListMemories(_Mem0Body):
    filters: dict[str, Any] | None = None


class UpdateMemory(_Mem0Body):
    """Fields not given are kept from the current version; `expiration_date: null` (which
    the client sends to clear it) leaves the retention alone."""

    text: str | None = Field(default=None, min_length=1, max_length=TEXT_MAX)
    metadata: dict[str, Any] | None = None  # replaces the memory's metadata
    timestamp: Timestamp | None = None
    expiration_date: str | None = Field(default=None, max_length=DATE_CHARS)


class BatchUpdateItem(_Mem0Body):
    memory_id: str = Field(min_length=1, max_length=ID_MAX)
    text: str | None = Field(default=None, min_length=1, max_length=TEXT_MAX)
    metadata: dict[str, Any] | None = None  # replaces the memory's metadata


class BatchUpdate(_Mem0Body):
    """`PUT /v1/batch/`: all or none, each item governed as a single update."""

    memories: list[BatchUpdateItem] = Field(min_length=1, max_length=BATCH_MAX)


class BatchDeleteItem(_Mem0Body):
    memory_id: str = Field(min_length=1, max_length=ID_MAX)


class BatchDelete(_Mem0Body):
    """`DELETE /v1/batch/`: every memory named must exist before any is deleted."""

    memories: list[BatchDeleteItem] = Field(min_length=1, max_length=BATCH_MAX)


IMPORT_MAX = 500  # memories one import request carries
CATEGORIES_MAX = 32
CATEGORY_MAX = 100


class ImportMemories(_Mem0Body):
    """`POST /memory/{spaceId}/v1/import/` (memgate's own, `memgate import mem0`): memories as
    mem0 lists or exports them, each checked on its own (`ImportedMemory`)."""

    memories: list[dict[str, Any]] = Field(min_length=1, max_length=IMPORT_MAX)


class ImportedMemory(_Mem0Body):
    """One memory as mem0 shows it (get_all, a platform export); other fields are ignored.
    `id` stays its mem0 id in the space: a memory whose id is there already is skipped."""

    id: str = Field(min_length=1, max_length=ID_MAX)
    memory: str = Field(min_length=1, max_length=TEXT_MAX)
    user_id: str | None = Field(default=None, min_length=1, max_length=ENTITY_MAX)
    agent_id: str | None = Field(default=None, min_length=1, max_length=ENTITY_MAX)
    run_id: str | None = Field(default=None, min_length=1, max_length=ENTITY_MAX)
    metadata: dict[str, Any] | None = None
    categories: list[Annotated[str, Field(min_length=1, max_length=CATEGORY_MAX)]] | None = (
        Field(default=None, max_length=CATEGORIES_MAX))
    created_at: datetime | None = None
    updated_at: datetime | None = None
    expiration_date: str | None = Field(default=None, max_length=DATE_CHARS)


class ImportOutcome(Contract):
    """What became of one memory of an import, in the order sent (never its text)."""

    id: str | None = None  # its mem0 id, when it had one
    status: Literal["imported", "skipped", "refused"]
    code: str | None = None  # why it was refused
    field: str | None = None
    retry_after_seconds: int | None = None  # refused by the hourly import budget


class ImportResults(Contract):
    results: list[ImportOutcome]


class Mem0Memory(Contract):
    """A memory as mem0 shows it: `id` is the mem0 id (stable across updates)."""

    id: str
    memory: str
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    metadata: dict[str, Any] | None = None
    categories: list[str] = Field(default_factory=list)
    created_at: datetime  # mem0's `timestamp` when the memory was added with one
    updated_at: datetime
    expiration_date: date | None = None
    score: float | None = None  # search only
    # memgate's own: memories are never evidence, never trusted (SPEC §3.7)
    type: Literal["memory"] = "memory"
    trust: Literal["untrusted"] = "untrusted"


class Added(Contract):
    id: str
    memory: str
    event: Literal["ADD"] = "ADD"
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    metadata: dict[str, Any] | None = None


class AddResults(Contract):
    results: list[Added]


class SearchResults(Contract):
    results: list[Mem0Memory]
    degraded: list[str] = Field(default_factory=list)  # as recall says (e.g. ["cosine"])


class MemoryPage(Contract):
    count: int
    next: str | None = None
    previous: str | None = None
    results: list[Mem0Memory]


class HistoryEntry(Contract):
    id: str  # the version's own id
    memory_id: str  # the mem0 id
    input: list[dict[str, Any]] = Field(default_factory=list)
    old_memory: str | None = None
    new_memory: str
    event: Literal["ADD", "UPDATE"]
    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    metadata: dict[str, Any] | None = None
    categories: list[str] = Field(default_factory=list)
    created_at: datetime
    updated_at: datetime


class History(Contract):
    entries: list[HistoryEntry]  # oldest first


class Mem0Message(Contract):
    message: str


class Ping(Contract):
    status: str = "ok"
    org_id: str  # the workspace
    project_id: str  # the space
    user_email: str | None = None


class SpaceLlmRequest(Contract):
    space_id: str


class SpaceLlm(Contract):
    """The spaces actor's answer to `mem.int.spaces.llm`: the LLM a space extracts facts with."""

    model_config = ConfigDict(extra="ignore")

    space_id: str
    workspace_id: str
    created_by: str  # the member who created the space
    llm_model_name: str | None = None
    llm_base_url: str | None = None


__all__ = [
    "BATCH_MAX", "BatchDelete", "BatchDeleteItem", "BatchUpdate", "BatchUpdateItem",
    "ENTITY_MAX", "MESSAGES_MAX", "MESSAGE_MAX", "PAGE_SIZE_MAX", "TEXT_MAX", "TOP_K_MAX",
    "AddMemories", "AddResults", "Added", "ExtractEvent", "ExtractRequest", "Extracted",
    "History", "HistoryEntry", "IMPORT_MAX", "ImportMemories", "ImportOutcome", "ImportResults",
    "ImportedMemory", "ListMemories", "Mem0Memory", "Mem0Message", "MemoryPage",
    "Message", "Ping", "SearchMemories", "SearchResults", "SpaceLlm", "SpaceLlmRequest",
    "UpdateMemory",
]

"""Agent memory commands (SPEC §3.1) and what they return."""

from __future__ import annotations

from datetime import date, datetime
from typing import Literal

from pydantic import ConfigDict, Field, JsonValue, model_validator

from memgate.contracts.base import Contract, Id, Instant
from memgate.contracts.registry import Citation
from memgate.contracts.reply import ErrorBody

SourceState = Literal["current", "changed"]


class _TimeTravel(Contract):
    as_of: Instant | None = None  # converted to UTC


IDEMPOTENCY_KEY_MAX = 255
IMPORT_AT_MOST = 1000  # items of one bulk import


class RememberRequest(Contract):
    namespace: str = Field(min_length=1, max_length=64)
    text: str = Field(min_length=1, max_length=1000)
    key: str | None = Field(default=None, min_length=1, max_length=120)
    collection_id: str | None = Field(default=None, min_length=1, max_length=64)
    citations: list[Id] = Field(default_factory=list, max_length=20)  # passage ids
    # A retry with the same key (the member's, within 24 h) gets the first answer and writes
    # nothing (REST: the `Idempotency-Key` header).
    idempotency_key: str | None = Field(default=None, min_length=1,
                                        max_length=IDEMPOTENCY_KEY_MAX)


class OperatorImportItem(RememberRequest):
    """An item of the operator's import: whose memory it is, and when it was first made."""

    member_id: Id
    created_at: Instant | None = None  # converted to UTC; now when absent


class ImportRequest(Contract):
    """A bulk import: remember bodies (`RememberRequest`; the operator's, naming the workspace,
    `OperatorImportItem`), each read and governed alone, so a bad item is refused alone."""

    items: list[JsonValue] = Field(min_length=1, max_length=IMPORT_AT_MOST)
    workspace_id: Id | None = None  # the operator's import only


class RecallRequest(_TimeTravel):
    query: str = Field(min_length=1, max_length=1000)
    namespace: str | None = Field(default=None, min_length=1, max_length=64)
    collection_id: str | None = Field(default=None, min_length=1, max_length=64)
    limit: int = Field(default=10, ge=1, le=50)


class ListRequest(_TimeTravel):
    namespace: str | None = Field(default=None, min_length=1, max_length=64)
    key: str | None = Field(default=None, min_length=1, max_length=120)
    collection_id: str | None = Field(default=None, min_length=1, max_length=64)
    limit: int = Field(default=20, ge=1, le=100)
    cursor: str | None = Field(default=None, max_length=200)


class ForgetRequest(Contract):
    memory_id: str | None = Field(default=None, min_length=1, max_length=64)
    namespace: str | None = Field(default=None, min_length=1, max_length=64)
    key: str | None = Field(default=None, min_length=1, max_length=120)
    # A retry with the same key gets the first answer (not 404: it deleted what it found)
    idempotency_key: str | None = Field(default=None, min_length=1,
                                        max_length=IDEMPOTENCY_KEY_MAX)

    @model_validator(mode="after")
    def _one_target(self) -> ForgetRequest:
        by_key = self.namespace is not None and self.key is not None
        both = self.memory_id is not None and (self.namespace or self.key)
        if (self.memory_id is None) == (not by_key) or both:
            raise ValueError("give either memoryId, or namespace and key")
        return self


class DeleteOwnMemories(Contract):
    """Self-service delete (SPEC §2.3): the listed ids, or every agent memory of the member."""

    memory_ids: list[Id] | None = Field(default=None, min_length=1, max_length=1000)


class Extras(Contract):
    """What a mem0 memory carries beyond its text (SPEC §4.4), stored with its version (the
    `extras` column): its metadata, every string in it masked like the text; the instant the
    client says it happened (mem0's `timestamp`), shown as its `created_at`; its expiration
    date (the version's `expires_at` is the start of that day, UTC, if sooner than the
    retention). Stored rows are read by newer code: unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    metadata: dict[str, JsonValue] | None = None
    timestamp: datetime | None = None
    expiration_date: date | None = None
    categories: list[str] | None = None  # mem0's, masked (an imported memory's)
    updated_at: datetime | None = None  # an imported memory's; a later update drops it


class Memory(Contract):
    """A memory as returned to an agent: never evidence, never trusted (SPEC §3.7)."""

    memory_id: str
    namespace: str
    key: str | None = None
    text: str
    collection_id: str | None = None
    created_at: datetime
    superseded_at: datetime | None = None
    type: Literal["memory"] = "memory"
    evidence: Literal[False] = False
    trust: Literal["untrusted"] = "untrusted"
    source_state: SourceState = "current"
    citations: list[Citation] = Field(default_factory=list)
    extras: Extras | None = None  # a mem0 memory's (None for agent memories: not sent)


class RememberResult(Contract):
    memory_id: str
    created_at: datetime
    superseded: int
    masked: dict[str, int] = Field(default_factory=dict)


class ImportedMemory(RememberResult):
    index: int  # the item's position in the request


class ImportRefusal(Contract):
    index: int
    error: ErrorBody


class ImportResult(Contract):
    """Each item's answer, by its position: stored (the first answer, for a key given before),
    or refused with the error a remember would have answered."""

    stored: list[ImportedMemory] = Field(default_factory=list)
    refused: list[ImportRefusal] = Field(default_factory=list)


class ListResult(Contract):
    memories: list[Memory]
    next_cursor: str | None = None
    hidden: int = 0


class ForgetResult(Contract):
    deleted: int


class Ranks(Contract):
    bm25: int | None = None
    cosine: int | None = None
    entity: int | None = None
    # the conversation channel and, reported beside it, its two parts (policy/context.py)
    conversation: int | None = None
    context: int | None = None
    smoothed: int | None = None


class RecalledMemory(Memory):
    score: float
    ranks: Ranks


class RecallResult(Contract):
    memories: list[RecalledMemory]
    degraded: list[str] = Field(default_factory=list)
    hidden: int = 0

"""The memory store's values: rows as read, filters, limits, a remember of a group, cursors,
and the filter rule as the in-memory mirror applies it (`allows`, the twin of
`MemoryStore._where`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, NamedTuple

from memgate.storage.recent import Version


@dataclass(frozen=True)
class Row:
    memory_id: str
    seq: int
    namespace: str
    key: str | None
    collection_id: str | None
    text: str
    created_at: datetime
    superseded_at: datetime | None
    citations: str  # JSON
    extras: str | None = None  # JSON: a mem0 memory's metadata (masked), timestamp, expiry


class CatalogRow(NamedTuple):
    """A version as the indexer's and embedder's catalogs take it (`MemoryReads.catalog`); the
    text only when asked."""

    memory_id: str
    seq: int
    namespace: str
    key: str | None
    collection_id: str | None
    created_at: datetime  # aware UTC
    superseded_at: datetime | None
    legal_hold: bool
    text: str | None


@dataclass(frozen=True)
class Stored:
    memory_id: str
    seq: int
    created_at: datetime
    superseded: int
    masked: str | None = None  # JSON: a replay's first answer's (`Remember.idempotency`)
    replayed: bool = False  # the first answer under the item's idempotency key: nothing written


@dataclass(frozen=True)
class Limits:
    remembers_per_hour: int = 120  # per credential
    versions_per_member: int = 5000  # per member and workspace, every version they wrote
    imports_per_hour: int = 10_000  # per credential: memories of bulk imports (the budget)


class LimitReachedError(Exception):
    """A remember refused by a limit; `retry_after` seconds for the rate limit, else None."""

    def __init__(self, limit: str, retry_after: int | None = None) -> None:
        super().__init__(limit)
        self.limit = limit
        self.retry_after = retry_after


@dataclass(frozen=True)
class Filters:
    tenant: str
    subject_id: str
    namespace: str | None = None
    key: str | None = None
    collection_id: str | None = None
    collection_ids: tuple[str, ...] | None = None  # any of these (a context set)
    namespaces: tuple[str, ...] | None = None  # any of these (a mem0 filter's entities)
    memory_ids: frozenset[str] | None = None  # any of these versions (a mem0 metadata filter's)
    keys: tuple[str, ...] | None = None  # any of these keys (the mem0 ids an import looks up)


@dataclass(frozen=True)
class Remember:
    """One remember of a group: the version to store (its event is built from its row)."""

    filters: Filters
    memory_id: str
    credential_id: str
    text: str
    retention_days: int
    citations: tuple[dict[str, Any], ...] = ()
    derived_from: tuple[str, ...] = ()  # source records beyond the cited passages
    member_id: str | None = None  # who writes it (a space's memory); None: its owner
    extras: str | None = None  # JSON: a mem0 memory's metadata (masked), timestamp, expiry
    expires_at: datetime | None = None  # naive UTC: sooner than the retention, if earlier
    # The hourly limit that counts it, per credential: a remember's, a bulk import's (stored
    # under `imported(credential)`, so that the two never count each other), or none (the
    # operator's import).
    rate: Literal["remembers", "imports"] | None = "remembers"
    created_at: datetime | None = None  # naive UTC: kept from elsewhere (the operator's import)
    idempotency: str | None = None  # the SHA-256 of the caller's key (`storage.idempotency`)
    masked: str = "{}"  # JSON: what governance masked, kept with the idempotency record

    def expires(self, created: datetime) -> datetime:
        """When the version expires: after `retention_days`, or at `expires_at` if sooner."""
        retained = created + timedelta(days=self.retention_days)
        return retained if self.expires_at is None else min(retained, self.expires_at)

    def limit(self, limits: Limits) -> int | None:
        """How many of its `rate` a credential may write per hour (None: unlimited)."""
        if self.rate is None:
            return None
        return limits.remembers_per_hour if self.rate == "remembers" else limits.imports_per_hour

    @property
    def counted_as(self) -> str:
        """The credential the version is stored under, and its hourly window counted by."""
        return imported(self.credential_id) if self.rate == "imports" else self.credential_id

    @property
    def writer(self) -> str:
        """The member whose version limit counts this version."""
        return self.member_id if self.member_id is not None else self.filters.subject_id


def imported(credential_id: str) -> str:
    """The credential a bulk import's versions are stored under: its budget is counted apart
    from the credential's remembers."""
    return f"{credential_id}:import"


# The payload of the event announcing a stored version, built from its row (so a file needs no
# copy of it): (seq, tenant, subject, memory id) → payload.
StoredEvent = Callable[[int, str, str, str], bytes]


def stored_json(seq: int, tenant: str, subject_id: str, memory_id: str) -> bytes:
    """A plain `StoredEvent`, for a store whose events no consumer reads as contracts."""
    return json.dumps({"seq": seq, "tenant": tenant, "subject_id": subject_id,
                       "memory_id": memory_id}).encode()


def key_of(filters: Filters) -> tuple[str, str, str, str] | None:
    if filters.key is None:
        return None
    return filters.tenant, filters.subject_id, filters.namespace or "", filters.key


def naive(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(tzinfo=None)


def aware(instant: datetime | None) -> datetime | None:
    return None if instant is None else instant.replace(tzinfo=UTC)


def row_of(version: Version) -> Row:
    return Row(version.memory_id, version.seq, version.namespace, version.key,
               version.collection_id, version.text, version.created_at.replace(tzinfo=UTC),
               aware(version.superseded_at), version.citations, version.extras)


def allows(filters: Filters, instant: datetime, version: Version) -> bool:
    """`MemoryStore._where` for a version of the filters' owner that is not on hold."""
    return (version.created_at <= instant
            and (version.superseded_at is None or version.superseded_at > instant)
            and filters.namespace in (None, version.namespace)
            and filters.key in (None, version.key)
            and filters.collection_id in (None, version.collection_id)
            and (filters.collection_ids is None
                 or (version.collection_id is not None
                     and version.collection_id in filters.collection_ids))
            and (filters.namespaces is None or version.namespace in filters.namespaces)
            and (filters.memory_ids is None or version.memory_id in filters.memory_ids))


def encode_cursor(seq: int, snapshot: datetime) -> str:
    raw = json.dumps({"s": seq, "t": naive(snapshot).isoformat()}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, datetime]:
    """Raises ValueError on anything that is not a cursor this store issued."""
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        seq, snapshot = data["s"], datetime.fromisoformat(data["t"]).replace(tzinfo=UTC)
    except (KeyError, TypeError, ValueError) as exc:  # JSON, base64, Unicode and date errors
        raise ValueError("not a cursor") from exc
    if type(seq) is not int or not 0 <= seq < 2**63:  # a BIGINT: no float, bool or 10**40
        raise ValueError("not a cursor")
    return seq, snapshot

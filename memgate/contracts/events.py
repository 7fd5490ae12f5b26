"""Facts published on JetStream. They carry ids only, never memory text (SPEC §3.2, §5.4).

Events outlive the process that wrote them and are read by older and newer processes alike, so,
unlike commands, they are open: unknown fields are ignored. `v` is the major version; a consumer
applies only versions up to `EVENT_VERSION` and dead-letters newer ones (`read_event`).
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from memgate.contracts.internal import Owner

EVENT_VERSION = 1  # the newest major version this code writes and understands


class Event(BaseModel):
    """The base of every event: frozen, camelCase on the wire, tolerant of unknown fields."""

    model_config = ConfigDict(
        frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True
    )

    v: int = EVENT_VERSION

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


# --- a partition's memories: `mem.evt.<partition>.memory` ---

class MemoryStored(Event):
    kind: Literal["stored"] = "stored"
    partition: str
    owner: Owner
    memory_id: str
    seq: int


class MemoriesDeleted(Event):
    kind: Literal["deleted"] = "deleted"
    partition: str
    owner: Owner
    memory_ids: list[str]


MemoryEvent = Annotated[MemoryStored | MemoriesDeleted, Field(discriminator="kind")]
MEMORY_EVENT: TypeAdapter[MemoryStored | MemoriesDeleted] = TypeAdapter(MemoryEvent)


def memory_changes(payloads: list[bytes]) -> tuple[dict[Owner, int], dict[Owner, list[str]]]:
    """A batch of memory events, read whole (`read_event`): each owner's newest stored seq,
    and each owner's deleted ids."""
    stored: dict[Owner, int] = {}
    deleted: dict[Owner, list[str]] = {}
    for event in [read_event(MEMORY_EVENT, p) for p in payloads]:
        if isinstance(event, MemoryStored):
            stored[event.owner] = max(stored.get(event.owner, 0), event.seq)
        else:
            deleted.setdefault(event.owner, []).extend(event.memory_ids)
    return stored, deleted


# --- the registry: `mem.evt.registry.<event>` (told apart by `event`, as they always were) ---

class DocumentUpserted(Event):
    event: Literal["doc_upserted"] = "doc_upserted"
    workspace_id: str
    document_id: str


class DocumentDeleted(Event):
    event: Literal["doc_deleted"] = "doc_deleted"
    workspace_id: str
    document_id: str


class CollectionDeleted(Event):
    event: Literal["collection_deleted"] = "collection_deleted"
    workspace_id: str
    collection_id: str
    document_ids: list[str]  # its documents that were live when it was deleted


RegistryEvent = DocumentUpserted | DocumentDeleted | CollectionDeleted
REGISTRY_EVENT: TypeAdapter[RegistryEvent] = TypeAdapter(
    Annotated[RegistryEvent, Field(discriminator="event")])


# --- the dead letter: `mem.dlq.<durable>` ---

class DeadLetter(Event):
    """A message a consumer gave up on. Ids and the reason only: the payload stays in its
    stream (it may be personal), where `stream_seq` finds it until the stream ages it out."""

    durable: str
    stream: str
    stream_seq: int
    subject: str
    deliveries: int
    error: str  # the failure's type name, or why an event could not be read


class UnreadableEventError(Exception):
    """An event no retry can apply: malformed, or of a newer major version. Its consumer
    terminates and dead-letters it at once."""

    def __init__(self, reason: Literal["malformed", "unsupported_version"]) -> None:
        super().__init__(reason)
        self.reason = reason


class _Version(Event):
    """Just the version of any event, to tell a newer event from a broken one."""


E = TypeVar("E", bound=Event)


def read_event(adapter: TypeAdapter[E], payload: bytes) -> E:
    """The event in `payload`, if this process understands it; else `UnreadableEventError`."""
    try:
        event = adapter.validate_json(payload)
    except ValidationError:
        try:
            newer = _Version.model_validate_json(payload).v > EVENT_VERSION
        except ValidationError:
            newer = False
        raise UnreadableEventError("unsupported_version" if newer else "malformed") from None
    if event.v > EVENT_VERSION:
        raise UnreadableEventError("unsupported_version")
    return event

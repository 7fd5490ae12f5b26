"""Sessions and events of memory spaces, and their lifecycle strategies (SPEC §4.2, §4.3).

A session is one conversation in a space; its events get `sequenceId` 0, 1, 2… with no gaps.
Strategies are written as in seed 004: `{"type": "soft_delete", "trigger": {"ttl": 604800}}`,
a trigger being exactly one of `{"ttl": seconds}` (from the session's creation),
`{"idle": seconds}` (from its last event) or `{"never": true}`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict, Field, JsonValue, SerializerFunctionWrapHandler, StrictInt, StringConstraints,
    field_validator, model_serializer, model_validator,
)

from memgate.contracts.base import Contract, Instant

OBJECT_ID = r"^[0-9a-fA-F]{24}$"
TOKEN = r"^[A-Za-z0-9_.:\-]+$"  # emitter types and ids, event types: ids, never free text

MAX_PARTICIPANTS = 100
MAX_BATCH = 200  # events appended in one transaction (SPEC §4.2)
MAX_STRATEGIES = 5
MAX_LAST_N = 200
EVENT_BODY_MAX_BYTES = 32 * 1024  # one event's body, as compact JSON
EVENT_BODY_MAX_DEPTH = 32  # nesting of arrays and objects in one event's body

ParticipantId = Annotated[str, StringConstraints(pattern=OBJECT_ID)]
Token = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=TOKEN)]
StrategyType = Literal["soft_delete", "extract_memories"]
Seconds = Annotated[StrictInt, Field(ge=1)]


class Trigger(Contract):
    """When a strategy runs: exactly one of `ttl`, `idle` (seconds) or `never: true`."""

    ttl: Seconds | None = None
    idle: Seconds | None = None
    never: Literal[True] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Trigger:
        if sum(value is not None for value in (self.ttl, self.idle, self.never)) != 1:
            raise ValueError("a trigger is exactly one of ttl, idle or never")
        return self

    @model_serializer(mode="wrap")
    def _only_its_kind(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """`{"ttl": 604800}`, as it was written, never with the other kinds as nulls."""
        return {key: value for key, value in handler(self).items() if value is not None}


class Strategy(Contract):
    type: StrategyType
    trigger: Trigger


class CreateSession(Contract):
    participants: list[ParticipantId] = Field(min_length=1, max_length=MAX_PARTICIPANTS)
    description: str = Field(default="", max_length=1000)
    # None: the default (soft_delete after 180 days); a list is validated by policy.lifecycle
    lifecycle_strategies: list[Strategy] | None = Field(default=None, max_length=100)


class PatchSession(Contract):
    """Only the fields present change. `lifecycleStrategies` replaces the whole list; present
    and null or empty, it is refused (422): the list cannot be cleared."""

    description: str | None = Field(default=None, max_length=1000)
    lifecycle_strategies: list[Strategy] | None = Field(default=None, max_length=100)


class NoBody(Contract):
    """The body of a command that takes none (a body the HTTP adapter refused fails here)."""


class LifecycleRun(Contract):
    type: StrategyType
    trigger: Trigger  # as it was when it ran
    ran_at: datetime


class SessionView(Contract):
    id: str
    space_id: str
    participants: list[str]
    description: str
    lifecycle_strategies: list[Strategy]
    lifecycle_runs: list[LifecycleRun] = Field(default_factory=list)
    version: int
    created_at: datetime
    updated_at: datetime
    last_event_at: datetime | None = None
    event_count: int = 0


class Emitter(Contract):
    type: Token
    id: Token


def _check_body(body: JsonValue) -> JsonValue:
    """Bounded depth, walked without recursion (a hostile body cannot exhaust the stack), and
    bounded size as sent: a body over EVENT_BODY_MAX_BYTES is refused before anything masks
    it (masking is linear, but a refusal should cost no more than reading the body)."""
    if body is None:  # a reply leaves out what is None: the event could not be shown
        raise ValueError("the body must not be null")
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > EVENT_BODY_MAX_DEPTH:
                raise ValueError(f"the body nests deeper than {EVENT_BODY_MAX_DEPTH} levels")
            children = value.values() if isinstance(value, dict) else value
            stack += [(child, depth + 1) for child in children]
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if len(raw.encode(errors="surrogatepass")) > EVENT_BODY_MAX_BYTES:
        raise ValueError(f"at most {EVENT_BODY_MAX_BYTES} bytes of JSON")
    return body


class EventIn(Contract):
    body: JsonValue
    emitter: Emitter
    event_type: Token

    _bounded = field_validator("body")(_check_body)


class EventBatch(Contract):
    events: list[EventIn]  # 1..MAX_BATCH, checked by the actor (more is a 422, not a 400)


class EventsQuery(Contract):
    last_n: int = Field(default=20, ge=1, le=MAX_LAST_N)


class EditEvent(Contract):
    """A new body; with `createdAt`, refused (412) if the event changed after that instant."""

    body: JsonValue
    created_at: Instant | None = None

    _bounded = field_validator("body")(_check_body)


class EventView(Contract):
    sequence_id: int
    body: JsonValue
    emitter: Emitter
    event_type: str
    created_at: datetime
    updated_at: datetime


class EventList(Contract):
    events: list[EventView]  # oldest first
    truncated: bool = False  # the oldest of the newest N left out to keep the reply bounded


# --- extract_memories: the sessions actor asks the space-memories actor ---


class ExtractEvent(Contract):
    sequence_id: int
    text: str  # masked: "<emitter type>: <content>"


class ExtractRequest(Contract):
    """Turn a session's masked events into memories of the space (`mem.int.spacemem.extract`).
    The memories' `derived_from` names the events as `<sessionId>/<sequenceId>`."""

    model_config = ConfigDict(extra="ignore")

    space_id: str
    workspace_id: str
    session_id: str
    participants: list[str]
    events: list[ExtractEvent]
    # whose version limit the memories count against: the session's creator (None: a session
    # from before sessions kept it; then the space's creator)
    member_id: str | None = None


class Extracted(Contract):
    model_config = ConfigDict(extra="ignore")

    memory_ids: list[str]


class SpaceDeleted(Contract):
    """A memory space is gone: its sessions and events go too (the spaces actor tells)."""

    tenant: str
    space_id: str


__all__ = [
    "EVENT_BODY_MAX_BYTES", "MAX_BATCH", "MAX_LAST_N", "MAX_STRATEGIES", "OBJECT_ID",
    "CreateSession",
    "EditEvent", "Emitter", "EventBatch", "EventIn", "EventList", "EventView", "EventsQuery",
    "ExtractEvent", "ExtractRequest", "Extracted", "LifecycleRun", "NoBody", "PatchSession",
    "SessionView", "SpaceDeleted", "Strategy", "StrategyType", "Trigger",
]


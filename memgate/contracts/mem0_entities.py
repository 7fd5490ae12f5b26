"""The entities of a memory space as mem0's client lists and deletes them (`users()`,
`delete_users()`, `reset()`; SPEC §4.4): each `user_id`, `agent_id` and `run_id` that
memories are about, with how many memories it has. Rendered in mem0's snake_case."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from memgate.contracts.base import Contract

EntityType = Literal["user", "agent", "run"]


class EntityView(Contract):
    id: str  # "<type>:<name>" (memgate's own: the name within its type)
    name: str
    type: EntityType
    total_memories: int
    owner: str  # the member who asked (mem0: the project's owner)
    organization: str  # the workspace
    created_at: datetime  # its oldest current memory's
    updated_at: datetime  # its newest current memory's
    metadata: dict[str, Any] = Field(default_factory=dict)


class EntityList(Contract):
    count: int
    next: str | None = None
    previous: str | None = None
    results: list[EntityView]


__all__ = ["EntityList", "EntityType", "EntityView"]

"""An imported mem0 memory checked and masked like an add (`memgate import mem0`, SPEC §4.4):
who it is about, its text, metadata and categories masked, its timestamps and expiry bounded.
Pure: the space-memories actor parses each item, calls `imported` off the event loop, and
skips the ones whose mem0 id the space already holds."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from memgate.contracts.errors import AgentMemoryEmptyError, ValidationFailedError
from memgate.contracts.mem0 import ImportedMemory
from memgate.contracts.memory import Extras
from memgate.contracts.spaces import Entity
from memgate.policy.masking import mask, mask_many
from memgate.policy.metadata import expiry_of, instant_of, masked_metadata


@dataclass(frozen=True)
class Imported:
    """A memory ready to store under its mem0 id (`key`), about `entity`."""

    key: str
    entity: Entity
    text: str  # masked
    masked: dict[str, int]
    extras: Extras


def imported(memory: ImportedMemory, now: datetime, field: str) -> Imported:
    """The memory as it is stored, or the first reason it is refused (VALIDATION_ERROR naming
    the field, AGENT_MEMORY_EMPTY, AGENT_MEMORY_PERSONAL_DATA for a metadata key)."""
    if memory.user_id is None and memory.agent_id is None and memory.run_id is None:
        raise ValidationFailedError("give at least one of user_id, agent_id, run_id",
                                    {"field": f"{field}.user_id"})
    masked = mask(memory.memory)
    if masked.only_placeholders:
        raise AgentMemoryEmptyError("nothing is left of the text after masking",
                                    {"masked": masked.counts, "field": f"{field}.memory"})
    created = (None if memory.created_at is None
               else instant_of(memory.created_at, now, f"{field}.created_at"))
    updated = (None if memory.updated_at is None
               else instant_of(memory.updated_at, now, f"{field}.updated_at"))
    extras = Extras(
        metadata=(None if memory.metadata is None
                  else masked_metadata(memory.metadata, f"{field}.metadata")),
        categories=mask_many(memory.categories) if memory.categories else None,
        timestamp=created, updated_at=updated,
        expiration_date=(None if memory.expiration_date is None
                         else expiry_of(memory.expiration_date, now,
                                        f"{field}.expiration_date")))
    return Imported(memory.id, Entity(user_id=memory.user_id, agent_id=memory.agent_id,
                                      run_id=memory.run_id), masked.text, masked.counts, extras)


__all__ = ["Imported", "imported"]

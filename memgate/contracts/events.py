"""Facts published on JetStream. They carry ids only, never memory text (SPEC §3.2, §5.4)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from memgate.contracts.base import Contract
from memgate.contracts.internal import Owner


class MemoryStored(Contract):
    v: int = 1
    kind: Literal["stored"] = "stored"
    partition: str
    owner: Owner
    memory_id: str
    seq: int


class MemoriesDeleted(Contract):
    v: int = 1
    kind: Literal["deleted"] = "deleted"
    partition: str
    owner: Owner
    memory_ids: list[str]


MemoryEvent = Annotated[MemoryStored | MemoriesDeleted, Field(discriminator="kind")]
MEMORY_EVENT: TypeAdapter[MemoryStored | MemoriesDeleted] = TypeAdapter(MemoryEvent)

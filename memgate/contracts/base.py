"""The base of every contract: frozen, closed, camelCase on the wire; shared field limits."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints
from pydantic.alias_generators import to_camel

ID_MAX = 128
"""The longest id (of a memory, passage, document, collection, context set…) a request may carry."""

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)
"""Instants in requests must lie in [EARLIEST, LATEST) once converted to UTC (README "Limits")."""


class Contract(BaseModel):
    """A frozen value object; JSON field names are camelCase, Python names snake_case."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


def canonical_id(value: str) -> str:
    """The one spelling of a person's external id, stored and looked up alike: an ObjectId
    (24 hex digits, a conversation participant) in lower case; any other id as given."""
    if len(value) == 24 and all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    return value


def as_utc(value: datetime | None) -> datetime | None:
    """Naive instants are read as UTC; aware ones are converted to UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def in_range(value: datetime) -> datetime:
    """An instant of a request in UTC; a ValueError (so a VALIDATION_ERROR) outside the range."""
    try:
        utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-12:00 has no UTC instant
        raise ValueError("the instant is out of range") from None
    if not EARLIEST <= utc < LATEST:
        raise ValueError(f"the instant must lie between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}")
    return utc


Id = Annotated[str, StringConstraints(min_length=1, max_length=ID_MAX)]
Instant = Annotated[datetime, AfterValidator(in_range)]

__all__ = ["EARLIEST", "ID_MAX", "LATEST", "Contract", "Id", "Instant", "as_utc", "canonical_id",
           "in_range"]
